"""The jobs table through the Store: claiming is atomic and ordered, leases go stale and are requeued with
their sweep, cancel and finish respect who owns the job. Real SQLite and real PostgreSQL."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import socket
import subprocess
import sys

import pytest

from moetune.db import open_store
from moetune.db.errors import InvalidRecord, RecordNotFound
from moetune.db.jobs import GRACE_ENV, MAX_ATTEMPTS
from moetune.db.leases import Owner

SPEC = {"problems": ["m=16,k=64,n=256,g=4,dtype=bf16"], "backend": "xla"}


def test_claims_go_by_priority_then_age_and_only_to_fitting_device_kinds(store):
    low = store.submit_job(SPEC)
    high = store.submit_job(SPEC, priority=5)
    h200 = store.submit_job(SPEC, device_kind="NVIDIA H200", priority=9)
    later = store.submit_job(SPEC)
    worker = Owner.here()
    # A worker of no declared kind never takes a job that targets one.
    assert [store.claim_job(worker).id for _ in range(3)] == [high, low, later]
    assert store.claim_job(worker) is None
    claimed = store.claim_job(worker, device_kind="NVIDIA H200")
    assert (claimed.id, claimed.state, claimed.attempts, claimed.owner) == (h200, "running", 1, str(worker))


def test_many_claimers_at_once_take_each_job_exactly_once(db_url):
    with open_store(db_url) as store:
        submitted = {store.submit_job(SPEC) for _ in range(12)}

    def claim_all(_: int) -> list[int]:
        with open_store(db_url) as own:
            owner, taken = Owner.here(), []
            while (job := own.claim_job(owner)) is not None:
                taken.append(job.id)
            return taken

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        taken = [job for batch in pool.map(claim_all, range(4)) for job in batch]
    assert sorted(taken) == sorted(submitted)


def test_heartbeat_finish_and_release_belong_to_the_owner(store):
    job_id = store.submit_job(SPEC)
    owner, other = Owner.here(), Owner.here()
    store.claim_job(owner)
    assert store.heartbeat_job(job_id, owner) and not store.heartbeat_job(job_id, other)
    assert store.set_job_sweep(job_id, owner, store.create_sweep(**_sweep())) is True
    assert not store.finish_job(job_id, other, "done")
    assert store.release_job(job_id, owner)
    assert store.get_job(job_id).state == "queued" and not store.heartbeat_job(job_id, owner)
    again = store.claim_job(other)
    assert (again.attempts, again.sweep_id) == (2, store.get_job(job_id).sweep_id)
    assert store.finish_job(job_id, other, "failed", "it broke")
    assert (store.get_job(job_id).state, store.get_job(job_id).error) == ("failed", "it broke")
    with pytest.raises(InvalidRecord):
        store.finish_job(job_id, other, "cancelled")


def _sweep() -> dict:
    return dict(backend="xla", strategy="grid", spec={}, host=socket.gethostname(), user="")


def _dead_owner() -> Owner:
    """An owner on this host whose process has exited."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    return dataclasses.replace(Owner.here(), pid=int(child.stdout))


def test_a_dead_workers_job_is_requeued_with_its_sweep_and_a_live_ones_is_not(store):
    dead, alive = _dead_owner(), Owner.here()
    dead_job, live_job = store.submit_job(SPEC), store.submit_job(SPEC)
    store.claim_job(dead)
    store.set_job_sweep(dead_job, dead, sweep_id := store.create_sweep(**_sweep()))
    store.claim_job(alive)
    assert store.get_job(dead_job).stale and not store.get_job(live_job).stale
    assert store.requeue_stale_jobs() == [dead_job]
    assert not store.heartbeat_job(dead_job, dead)  # its lease is gone: a late write is refused
    job = store.claim_job(alive)
    assert (job.id, job.sweep_id, job.attempts) == (dead_job, sweep_id, 2)


def test_a_silent_worker_is_stale_after_the_grace_period(store, monkeypatch):
    elsewhere = Owner("another-host", 1, "t" * 16)  # no pid check: only the heartbeat's age counts
    job_id = store.submit_job(SPEC)
    store.claim_job(elsewhere)
    assert store.requeue_stale_jobs() == []
    monkeypatch.setenv(GRACE_ENV, "0.001")
    assert store.requeue_stale_jobs() == [job_id]


def test_a_job_that_kills_its_workers_fails_after_max_attempts(store):
    job_id = store.submit_job(SPEC)
    for _ in range(MAX_ATTEMPTS):
        store.claim_job(_dead_owner())
        store.requeue_stale_jobs()
    job = store.get_job(job_id)
    assert (job.state, job.attempts) == ("failed", MAX_ATTEMPTS) and "stopped" in job.error


def test_cancel_ends_a_queued_or_running_job_and_refuses_an_ended_one(store):
    owner = Owner.here()
    running = store.submit_job(SPEC)
    store.claim_job(owner)
    queued = store.submit_job(SPEC)
    assert store.cancel_job(queued).state == "cancelled"
    assert store.cancel_job(running).state == "cancelled"
    assert not store.heartbeat_job(running, owner)  # its worker stops at its next heartbeat
    assert store.claim_job(owner) is None
    with pytest.raises(InvalidRecord, match="ended"):
        store.cancel_job(queued)
    with pytest.raises(RecordNotFound):
        store.cancel_job(999)
    with pytest.raises(InvalidRecord, match="state"):
        store.jobs(states=("paused",))
    assert [j.id for j in store.jobs(states=("cancelled",))] == [queued, running]
