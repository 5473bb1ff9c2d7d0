"""Faults end honestly (tuner/driver.py): a crashed candidate and a failed re-timing get one more
attempt, a re-timing that fails twice leaves the sweep incomplete, a database that stops accepting
writes fails the sweep, and a sweep whose lease was taken over stops. Simulated runner, real databases."""

from __future__ import annotations

import time

import pytest

from moetune.db import leases
from moetune.db.errors import DatabaseError, LeaseHeld, LeaseLost
from moetune.db.leases import GRACE_S, Owner
from moetune.tuner.driver import SweepDriver
from moetune.tuner.executors import InlineExecutor
from moetune.tuner.spec import SweepSpec
from moetune.tuner.tasks import CRASHED, CandidateTask, RetimeTask, failed
from tests.db.db_factories import age_heartbeat
from tests.tuner import sim_backend
from tests.tuner.test_driver import DEVICE, PROBLEM, sim_trials

KILLED = "worker w3 failed while verifying and timing: the actor died unexpectedly"


def run_sweep(store, runner, *, sweep_id=None, owner=None, **settings):
    spec = SweepSpec(backend="sim", baseline=False, **settings)
    if sweep_id is None:
        sweep_id = store.create_sweep(
            backend="sim", strategy=spec.strategy, spec={}, host="h", user="u", owner=owner
        )
    driver = SweepDriver(store, InlineExecutor(runner, DEVICE), spec, backend="sim", poll_s=0, owner=owner)
    return driver.run([PROBLEM], sweep_id=sweep_id)


def crashing(tiles_and_times: dict[int, int], calls: list):
    """A runner whose candidates of the given tiles crash (their worker dies) the first N times."""
    left = dict(tiles_and_times)

    def run(task):
        if isinstance(task, CandidateTask):
            tile = task.config["tile"]
            calls.append(tile)
            if left.get(tile, 0) > 0:
                left[tile] -= 1
                return failed(task, CRASHED, KILLED, worker="w3", host="node7")
        return sim_backend.simulate(task)

    return run


def test_a_candidate_whose_worker_was_killed_passes_its_second_attempt(store, sim):
    sim_backend.COSTS.update({3: 1e-4})  # the fastest: it must not be lost to a killed worker
    calls = []
    outcome = run_sweep(store, crashing({3: 1}, calls), budget=4)
    rows = {r.config["tile"]: r for r in sim_trials(store, sweep_id=outcome.sweep_id)}
    assert sorted(rows) == [1, 2, 3, 4] and calls.count(3) == 2  # one trial per config, within the budget
    assert rows[3].status == "ok"
    first = rows[3].details["first_attempt"]
    assert (first["status"], first["error"], first["worker"], first["host"]) == (
        "crashed",
        KILLED,
        "w3",
        "node7",
    )
    assert rows[1].details is None  # a first attempt that passed leaves nothing extra
    assert outcome.problems[0].winner_config == {"tile": 3}


def test_a_kernel_that_really_crashes_crashes_twice_and_is_recorded_once(store, sim):
    calls = []
    outcome = run_sweep(store, crashing({5: 2}, calls))
    rows = [r for r in sim_trials(store, sweep_id=outcome.sweep_id) if r.config == {"tile": 5}]
    assert calls.count(5) == 2 and len(rows) == 1
    assert rows[0].status == "crashed" and rows[0].error == KILLED
    assert rows[0].details["first_attempt"]["status"] == "crashed"
    assert outcome.status == "done" and outcome.problems[0].counts["crashed"] == 1


def test_resume_neither_repeats_nor_loses_a_retried_candidate(store, sim):
    calls = []
    crash_then_stop = crashing({2: 1}, calls)

    def interrupted_on_the_retry(task):
        if isinstance(task, CandidateTask) and calls.count(2) == 1 and task.config["tile"] == 2:
            raise KeyboardInterrupt  # the driver dies between the crash and its second attempt
        return crash_then_stop(task)

    sweep_id = store.create_sweep(backend="sim", strategy="grid", spec={}, host="h", user="u")
    with pytest.raises(KeyboardInterrupt):
        run_sweep(store, interrupted_on_the_retry, sweep_id=sweep_id)
    assert {r.config["tile"] for r in sim_trials(store, sweep_id=sweep_id)} == {1}  # 2 not recorded yet
    again = []
    run_sweep(store, crashing({}, again), sweep_id=sweep_id)
    assert 2 in again and 1 not in again  # not lost, and nothing finished is repeated
    rows = sim_trials(store, sweep_id=sweep_id)
    assert sorted(r.config["tile"] for r in rows) == list(sim_backend.TILES)
    after = []
    run_sweep(store, crashing({}, after), sweep_id=sweep_id)
    assert [c for c in after] == []  # the retried config is done: a resume runs it no more


def retiming(failures: int, calls: list):
    """A runner whose re-timing comes back with no finalist timed (its worker died) `failures` times."""
    left = [failures]

    def run(task):
        if isinstance(task, RetimeTask):
            calls.append(task.task_id)
            if left[0] > 0:
                left[0] -= 1
                return failed(task, CRASHED, "worker w1 failed while verifying and timing: killed")
        return sim_backend.simulate(task)

    return run


def test_a_failed_re_timing_is_retried_once(store, sim):
    sim_backend.COSTS.update({4: 1e-4})
    calls = []
    outcome = run_sweep(store, retiming(1, calls))
    assert len(calls) == 2 and len(set(calls)) == 2  # a new task: another worker, not the dead one
    assert outcome.status == "done" and outcome.problems[0].winner_config == {"tile": 4}
    assert "first winner" in outcome.problems[0].decision


def test_a_re_timing_that_fails_twice_promotes_nothing_and_the_sweep_is_incomplete(store, sim):
    sim_backend.COSTS.update({3: 2e-4})
    run_sweep(store, sim_backend.simulate, budget=3)  # tile 3 is the winner now
    key = PROBLEM.problem.key
    before = store.current_winner(fingerprint_hash=DEVICE.hash, backend="sim", problem_key=key)
    sim_backend.COSTS.update({7: 1e-4})  # a faster challenger, which this sweep cannot confirm
    calls = []
    outcome = run_sweep(store, retiming(2, calls))
    assert len(calls) == 2
    assert outcome.status == "incomplete" and outcome.incomplete == [PROBLEM.label]
    assert (
        "re-timing failed twice" in outcome.problems[0].decision and "killed" in outcome.problems[0].decision
    )
    assert store.get_sweep(outcome.sweep_id).status == "incomplete"
    after = store.current_winner(fingerprint_hash=DEVICE.hash, backend="sim", problem_key=key)
    assert after.id == before.id  # no new winner
    # Resuming re-times it (and times nothing again).
    candidates = []

    def healthy(task):
        if isinstance(task, CandidateTask):
            candidates.append(task)
        return sim_backend.simulate(task)

    resumed = run_sweep(store, healthy, sweep_id=outcome.sweep_id)
    assert candidates == [] and resumed.status == "done"
    assert store.current_winner(fingerprint_hash=DEVICE.hash, backend="sim", problem_key=key).config == {
        "tile": 7
    }


class WritesStop:
    """The store, until `after` trials are written; then every write named in `refused` raises
    DatabaseError, as a database that stops accepting writes does (a read-only file, a full disk)."""

    WRITES = ("record_trial", "promote", "heartbeat", "checkpoint", "finish_sweep")

    def __init__(self, store, after: int, refused=WRITES) -> None:
        self._store, self._left, self._refused = store, after, set(refused)

    def __getattr__(self, name):
        attribute = getattr(self._store, name)
        if name not in self.WRITES:
            return attribute

        def write(*args, **kwargs):
            if name in self._refused and self._left <= 0:
                raise DatabaseError(f"database sqlite:///x.db: attempt to write a readonly database ({name})")
            if name == "record_trial":
                self._left -= 1
            return attribute(*args, **kwargs)

        return write


@pytest.mark.parametrize("finish", [True, False])
def test_a_database_that_stops_accepting_writes_fails_the_sweep(store, sim, finish):
    sweep_id = store.create_sweep(backend="sim", strategy="grid", spec={}, host="h", user="u")
    refused = WritesStop.WRITES if not finish else ("record_trial", "promote", "heartbeat", "checkpoint")
    broken = WritesStop(store, after=3, refused=refused)
    driver = SweepDriver(
        broken, InlineExecutor(sim_backend.simulate, DEVICE), SweepSpec(backend="sim"), backend="sim"
    )
    with pytest.raises(DatabaseError, match=r"readonly database \(record_trial\)"):  # the first failure
        driver.run([PROBLEM], sweep_id=sweep_id)
    assert len(store.trials(sweep_id=sweep_id)) == 3
    assert store.get_sweep(sweep_id).stored_status == ("failed" if finish else "running")


def take_over(url, store, sweep_id: int, taker: Owner) -> None:
    """Age the heartbeat past the grace period and take the lease (again if a beat came in between)."""
    for _ in range(20):
        age_heartbeat(url, sweep_id, GRACE_S + 1)
        try:
            store.acquire_sweep(sweep_id, taker)
            return
        except LeaseHeld:
            continue
    pytest.fail("the lease could not be taken over")


def test_the_heartbeat_keeps_the_lease_and_a_taken_over_sweep_stops(db_url, sim, monkeypatch):
    from moetune.db import open_store

    monkeypatch.setattr(leases, "HEARTBEAT_S", 0.05)
    owner, taker = Owner.here(), Owner.here()
    with open_store(db_url) as store:
        sweep_id = store.create_sweep(
            backend="sim", strategy="grid", spec={}, host="h", user="u", owner=owner
        )
        beats = []

        def slow(task):
            time.sleep(0.25)
            beats.append(store.get_sweep(sweep_id).heartbeat_age_s)
            if len(beats) == 4:  # the owner seems silent long enough for another process to take over
                take_over(db_url, store, sweep_id, taker)
            return sim_backend.simulate(task)

        with pytest.raises(LeaseLost, match=f"sweep {sweep_id}"):
            run_sweep(store, slow, sweep_id=sweep_id, owner=owner)
        # Sampled 0.5-1 s after the sweep began: a heartbeat that stopped at the start would be that old in
        # every sample; one renewed every 0.05 s is fresh in at least one, even on a loaded machine.
        assert min(beats[1:4]) < 0.5, beats
        row = store.get_sweep(sweep_id)
        assert (row.stored_status, row.owner) == ("running", str(taker))  # the stopped run wrote nothing
        # The fourth result came in after the take-over: the write itself checks the lease, so it is refused
        # however late the heartbeat thread notices.
        assert len(sim_trials(store, sweep_id=sweep_id)) == 3


@pytest.mark.parametrize("write", ["heartbeat", "checkpoint"])
def test_a_heartbeat_the_database_refuses_fails_the_sweep(store, sim, monkeypatch, write):
    """The heartbeat thread beats and checkpoints every HEARTBEAT_S: a database that refuses either ends
    the sweep there, not at its end."""
    monkeypatch.setattr(leases, "HEARTBEAT_S", 0.01)
    owner = Owner.here()
    sweep_id = store.create_sweep(backend="sim", strategy="grid", spec={}, host="h", user="u", owner=owner)
    broken = WritesStop(store, after=1, refused=(write,))

    def slow(task):
        time.sleep(0.05)
        return sim_backend.simulate(task)

    driver = SweepDriver(
        broken, InlineExecutor(slow, DEVICE), SweepSpec(backend="sim"), backend="sim", owner=owner
    )
    with pytest.raises(DatabaseError, match=rf"readonly database \({write}\)"):
        driver.run([PROBLEM], sweep_id=sweep_id)
    assert store.get_sweep(sweep_id).status == "failed"
    assert len(store.trials(sweep_id=sweep_id)) < len(sim_backend.TILES)  # it stopped there
