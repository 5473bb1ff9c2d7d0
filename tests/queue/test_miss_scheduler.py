"""Tune on miss: the most-missed problems of each device kind become jobs, at most N per pass, never one
for a problem that has a queued or running job or a fresh winner; a server with tune_misses runs it."""

from __future__ import annotations

import dataclasses
import time

from moetune.kernels import registry
from moetune.kernels.problem import Problem
from moetune.service.app import create_app
from moetune.service.miss_scheduler import MissPolicy, enqueue_misses, problem_text
from moetune.service.settings import ServiceSettings
from moetune.tuner.plan import parse_problem
from tests.db.db_factories import H200, MI300, trial
from tests.service.local_client import local_client

SMALL = Problem("grouped_matmul", m=16, k=64, n=256, g=4)
PROBLEMS = [dataclasses.replace(SMALL, m=m) for m in (16, 32, 64)]


def _miss(store, device, problem, times: int) -> None:
    for _ in range(times):
        store.record_miss(device=device, backend="xla", problem=problem)


def _queued(store) -> list[tuple[str | None, str, int | None]]:
    """(device kind, problem key, budget) of each queued job, oldest first."""
    rows = reversed(store.jobs(states=("queued",)))
    return [(j.device_kind, parse_problem(j.spec["problems"][0]).problem.key, j.spec["budget"]) for j in rows]


def test_problem_text_reads_back_as_the_same_problem():
    odd = Problem("grouped_matmul", m=8, k=128, n=64, g=2, out_dtype="float32", transpose_rhs=True)
    for problem in (SMALL, odd):
        assert parse_problem(problem_text(problem)).problem == problem


def test_most_missed_first_at_most_n_per_device_kind_and_never_twice(store):
    for problem, times in zip(PROBLEMS, (1, 5, 3), strict=True):
        _miss(store, H200, problem, times)
    _miss(store, MI300, PROBLEMS[0], 2)
    policy = MissPolicy(limit=2, budget=8)
    assert len(enqueue_misses(store, policy)) == 3
    h200, mi300 = H200.device_kind, MI300.device_kind
    assert _queued(store) == [
        (h200, PROBLEMS[1].key, 8),  # missed 5 times
        (h200, PROBLEMS[2].key, 8),  # 3
        (mi300, PROBLEMS[0].key, 8),  # 2; the H200's third (1) waits: two per device kind per pass
    ]
    # The next pass: the queued problems are left out; the last of the H200's comes in.
    assert len(enqueue_misses(store, policy)) == 1
    assert _queued(store)[-1] == (h200, PROBLEMS[0].key, 8)
    assert enqueue_misses(store, policy) == []


def test_a_problem_with_a_fresh_winner_or_a_running_job_is_left_out(store):
    from moetune.db.leases import Owner

    source = registry.get("xla").source_hash()
    for problem in PROBLEMS:
        _miss(store, H200, problem, 1)
    won = store.record_trial(trial(backend="xla", source_hash=source, problem=PROBLEMS[0], config={}))
    store.promote(won)
    stale = store.record_trial(trial(backend="xla", source_hash="older", problem=PROBLEMS[1], config={}))
    store.promote(stale)  # found with another kernel source: not fresh, so tuned again
    running = store.submit_job({"problems": [problem_text(PROBLEMS[2])], "backend": "xla"}, device_kind=None)
    store.claim_job(Owner.here())
    assert store.get_job(running).state == "running"
    enqueue_misses(store, MissPolicy(limit=5))
    assert [key for _, key, _ in _queued(store)] == [PROBLEMS[1].key]


def test_a_server_with_tune_misses_queues_them_at_start(sqlite_url):
    settings = ServiceSettings(
        db_url=sqlite_url, tune_misses=1, tune_misses_budget=4, tune_misses_period_s=60
    )
    with local_client(create_app(settings)) as c:
        _miss(c.app.state.store, H200, PROBLEMS[0], 1)
    with local_client(create_app(settings)) as c:  # a pass runs as the server starts
        deadline = time.monotonic() + 10
        while not (jobs := c.get("/api/jobs").json()) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert [(j["device_kind"], j["spec"]["budget"], j["submitted_by"]) for j in jobs] == [
        (H200.device_kind, 4, "tune-on-miss")
    ]


def test_a_queued_miss_is_tuned_by_a_worker_and_its_winner_then_found(sqlite_url):
    """The whole loop on this machine's device: a miss, its job, a worker (in this process, --inline),
    the winner the next lookup finds, and no second job for it."""
    from typer.testing import CliRunner

    from moetune.cli import _load_commands, app
    from moetune.db import open_store
    from moetune.kernels.device import current_fingerprint

    device = current_fingerprint()
    with open_store(sqlite_url) as store:
        _miss(store, device, SMALL, 1)
        (job_id,) = enqueue_misses(store, MissPolicy(limit=1, budget=3))
    _load_commands()
    args = ["worker", "--once", "--inline", "--device-kind", device.device_kind, "--db", sqlite_url]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    with open_store(sqlite_url) as store:
        assert store.get_job(job_id).state == "done"
        key = dict(fingerprint_hash=device.hash, backend="xla", problem_key=SMALL.key)
        assert store.current_winner(**key) is not None
        assert enqueue_misses(store, MissPolicy(limit=1, budget=3)) == []
