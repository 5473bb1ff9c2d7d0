"""The sweep lease (moetune.db.leases) on SQLite and PostgreSQL: one owner per sweep, stale leases taken
over and shown as dead, one timing sweep per device fingerprint."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from db_factories import H200, H200_NEW_DRIVER, age_heartbeat, trial

from moetune.db import open_store
from moetune.db.errors import DatabaseError, DeviceBusy, LeaseHeld, LeaseLost
from moetune.db.leases import GRACE_S, Heartbeat, Owner


def new_sweep(store, owner: Owner | None = None, device=None, force: bool = False) -> int:
    return store.create_sweep(
        backend="fake",
        strategy="grid",
        spec={"problems": [{"x": 1}, {"x": 2}], "device": H200.to_dict()},
        host="h",
        user="u",
        owner=owner,
        device=device,
        force=force,
    )


def dead_pid() -> int:
    """The id of a process of this host that has ended."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_live_lease_refuses_a_second_owner_naming_the_first(store):
    first = Owner.here()
    sweep_id = new_sweep(store, first)
    row = store.get_sweep(sweep_id)
    assert (row.status, row.stored_status, row.owner) == ("running", "running", str(first))
    assert 0 <= row.heartbeat_age_s < GRACE_S
    with pytest.raises(LeaseHeld) as info:
        store.acquire_sweep(sweep_id, Owner.here())
    message = str(info.value)
    assert f"sweep {sweep_id} is running on {first}" in message and "s ago" in message
    assert "\n" not in message
    store.acquire_sweep(sweep_id, first)  # the owner itself may renew it
    assert store.heartbeat(sweep_id, first)


def test_a_silent_lease_is_dead_and_taken_over_and_its_old_owner_stops(db_url):
    old, new = Owner.here(), Owner.here()
    with open_store(db_url) as store:
        sweep_id = new_sweep(store, old)
        age_heartbeat(db_url, sweep_id, GRACE_S + 5)
        row = store.get_sweep(sweep_id)
        assert (row.status, row.stored_status) == ("dead", "running") and row.heartbeat_age_s > GRACE_S
        store.acquire_sweep(sweep_id, new)
        assert store.get_sweep(sweep_id).status == "running"
        assert not store.heartbeat(sweep_id, old)  # the old owner learns it lost the lease
        with pytest.raises(LeaseLost, match=f"no longer run by {old} but by {new}"):
            store.finish_sweep(sweep_id, "done", owner=old)
        with pytest.raises(LeaseLost):
            store.claim_device(sweep_id, old, H200)
        with pytest.raises(LeaseLost):
            store.record_trial(trial(sweep_id=sweep_id), owner=old)
        assert store.get_sweep(sweep_id).stored_status == "running"  # nothing written by the old owner
        assert store.trials(sweep_id=sweep_id) == []
        store.record_trial(trial(sweep_id=sweep_id), owner=new)
        store.finish_sweep(sweep_id, "done", owner=new)
        assert store.get_sweep(sweep_id).status == "done"


def test_a_killed_owner_on_this_host_is_dead_at_once(store):
    gone = Owner(Owner.here().host, dead_pid(), "0" * 16)
    sweep_id = new_sweep(store, gone)
    row = store.get_sweep(sweep_id)
    assert row.status == "dead" and row.heartbeat_age_s < GRACE_S
    store.acquire_sweep(sweep_id, Owner.here())


def test_another_hosts_owner_is_judged_by_its_heartbeat_only(db_url):
    elsewhere = Owner("other-host", dead_pid(), "1" * 16)  # that pid means nothing on this host
    with open_store(db_url) as store:
        sweep_id = new_sweep(store, elsewhere)
        assert store.get_sweep(sweep_id).status == "running"
        with pytest.raises(LeaseHeld, match="other-host"):
            store.acquire_sweep(sweep_id, Owner.here())
        age_heartbeat(db_url, sweep_id, GRACE_S + 1)
        store.acquire_sweep(sweep_id, Owner.here())


def test_a_resumer_holds_the_lease_before_the_sweep_runs_again_and_an_ended_sweep_is_free(store):
    first = Owner.here()
    sweep_id = new_sweep(store, first)
    store.finish_sweep(sweep_id, "interrupted", owner=first)
    row = store.get_sweep(sweep_id)
    assert (row.status, row.owner, row.heartbeat_age_s) == ("interrupted", str(first), None)
    resumer = Owner.here()
    store.acquire_sweep(sweep_id, resumer)  # an ended sweep's lease is free at once
    assert store.get_sweep(sweep_id).status == "interrupted"  # until it runs again (claim_device)
    with pytest.raises(LeaseHeld):  # while the first resumer starts its workers
        store.acquire_sweep(sweep_id, Owner.here())
    store.claim_device(sweep_id, resumer, H200)
    assert store.get_sweep(sweep_id).status == "running"


def test_a_sweep_without_heartbeat_is_dead_and_a_released_one_is_free(store):
    legacy = new_sweep(store)  # no owner: as every sweep recorded before leases
    assert store.get_sweep(legacy).status == "dead" and store.get_sweep(legacy).heartbeat_age_s is None
    owner = Owner.here()
    store.acquire_sweep(legacy, owner)
    store.release_sweep(legacy, owner)
    assert store.get_sweep(legacy).status == "dead"
    store.acquire_sweep(legacy, Owner.here())  # no waiting for the grace period
    store.finish_sweep(legacy, "failed")
    assert store.get_sweep(legacy).status == "failed"  # only running sweeps can be dead


def test_one_timing_sweep_per_device_unless_forced(db_url):
    first = Owner.here()
    with open_store(db_url) as store:
        busy = new_sweep(store, first, device=H200)
        sweeps = len(store.sweeps())
        with pytest.raises(DeviceBusy) as info:
            new_sweep(store, Owner.here(), device=H200)
        assert f"sweep {busy} on {first}" in str(info.value) and "--force" in str(info.value)
        assert len(store.sweeps()) == sweeps  # refused: nothing written
        forced = new_sweep(store, Owner.here(), device=H200, force=True)
        mover = Owner.here()
        other_device = new_sweep(store, mover, device=H200_NEW_DRIVER)
        # A resumed sweep claims its device once its workers know it: refused the same way.
        resumer = Owner.here()
        compile_only = new_sweep(store, resumer)
        with pytest.raises(DeviceBusy):
            store.claim_device(compile_only, resumer, H200)
        store.claim_device(compile_only, resumer, None)  # compile-only claims no device
        store.finish_sweep(forced, "done")
        age_heartbeat(db_url, busy, GRACE_S + 1)  # a dead sweep holds no device
        store.claim_device(other_device, mover, H200)
        assert store.get_sweep(other_device).device_kind == H200.device_kind


def at_once(url: str, count: int, attempt) -> list[str]:
    """What `attempt(store)` returned in each of `count` threads started together (each with a store of
    its own on `url`), sorted."""
    results: list[str] = []
    start = threading.Barrier(count)

    def run() -> None:
        with open_store(url) as own:
            start.wait()
            results.append(attempt(own))

    threads = [threading.Thread(target=run) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(results)


def test_two_sweeps_claiming_one_device_at_once_get_it_once(db_url):
    with open_store(db_url) as store:
        store.ensure_device(H200)

    def claim(own) -> str:
        try:
            new_sweep(own, Owner.here(), device=H200)
            return "claimed"
        except DeviceBusy:
            return "busy"

    assert at_once(db_url, 4, claim) == ["busy", "busy", "busy", "claimed"]


def test_two_resumers_at_once_get_the_lease_once(db_url):
    with open_store(db_url) as store:
        sweep_id = new_sweep(store)  # a dead sweep, free to take over

    def resume(own) -> str:
        try:
            own.acquire_sweep(sweep_id, Owner.here())
            return "resumed"
        except LeaseHeld:
            return "refused"

    assert at_once(db_url, 4, resume) == ["refused", "refused", "refused", "resumed"]


def test_sweeps_lists_newest_first_with_counts_and_device(store):
    first = new_sweep(store, Owner.here(), device=H200)
    second = new_sweep(store, Owner.here(), device=H200_NEW_DRIVER)
    store.record_trial(trial(sweep_id=first))
    store.record_trial(trial(sweep_id=first, config={"block_m": 8}))
    rows = store.sweeps()
    assert [r.id for r in rows] == [second, first]
    assert [(r.trials, r.problems, r.device_kind) for r in rows] == [
        (0, 2, "NVIDIA H200"),
        (2, 2, "NVIDIA H200"),
    ]
    assert [r.id for r in store.sweeps(limit=1)] == [second]
    assert store.get_sweep(first).trials == 2


def test_heartbeat_thread_reports_a_lost_lease_and_a_failing_database():
    answers = iter([True, False])
    lost = Heartbeat(lambda: next(answers), "sweep 3", interval_s=0.01)
    lost.start()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            lost.check()
        except LeaseLost as e:
            assert "sweep 3" in str(e)
            break
        time.sleep(0.01)
    else:
        pytest.fail("the lost lease was never reported")
    lost.stop()

    def refuse() -> bool:
        raise DatabaseError("database sqlite:///x.db: attempt to write a readonly database")

    failing = Heartbeat(refuse, "sweep 4", interval_s=0.01)
    failing.start()
    deadline = time.monotonic() + 5  # polled, not slept: the thread's first beat may come late under load
    while time.monotonic() < deadline:
        try:
            failing.check()
        except DatabaseError as e:
            assert "readonly" in str(e)
            break
        time.sleep(0.01)
    else:
        pytest.fail("the failing database was never reported")
    failing.stop()
    with pytest.raises(DatabaseError, match="readonly"):
        failing.check()
