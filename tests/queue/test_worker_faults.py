"""Real `moetune worker` processes on the xla backend on CPU, in-process (--inline: the Ray path is tune's,
tested by tests/tuner/test_resume_cli.py): a worker killed with SIGKILL mid-job leaves a job that the next
worker resumes, ending with every planned trial exactly once (SQLite and PostgreSQL); two workers started
at once never both run one job (PostgreSQL); a worker stopped with SIGTERM loses no queued job; a
cancelled running job stops its sweep."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from moetune.db import open_store
from moetune.db.jobs import GRACE_ENV, HEARTBEAT_ENV
from moetune.tuner import queue_spec
from moetune.tuner.spec import SweepSpec
from moetune.tuner.tasks import canonical
from tests.queue import held_worker

pytestmark = pytest.mark.slow

PROBLEM = "m=16,k=64,n=256,g=4,dtype=bf16"
BUDGET = 4  # trials of the job's one problem
CLI = [sys.executable, "-c", "from moetune.cli import main; main()"]
# The same CLI with the candidates after the first few held until the test lets them go (held_worker.py),
# so that a worker is stopped mid-job however slow the machine.
HELD_CLI = [sys.executable, "-c", "import tests.queue.held_worker as w; w.main()"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# One finalist re-timed once: the sweep's end costs little.
SPEC = SweepSpec(
    problems=(PROBLEM,), backend="xla", baseline=False, budget=BUDGET, finalists=1, retime_rounds=1
)


def _submit(db_url: str, spec: SweepSpec = SPEC, **options) -> int:
    with open_store(db_url) as store:  # created here, so that polling never races a worker's migration
        return store.submit_job(queue_spec.stored(spec), **options)


def _env(db_url: str) -> dict[str, str]:
    # MOETUNE_DB, not --db: the CLI refuses a password on its command line. A short lease, so that a
    # silent worker's job is requeued within seconds.
    return os.environ | {"MOETUNE_DB": db_url, GRACE_ENV: "3", HEARTBEAT_ENV: "0.5"}


def _cli(db_url: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=_env(db_url))
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _worker(db_url: str, log, *args: str) -> subprocess.Popen:
    return subprocess.Popen([*CLI, "worker", "--inline", *args], stdout=log, stderr=log, env=_env(db_url))


def _held_worker(db_url: str, log, *args: str, after: int = 1, release=None) -> subprocess.Popen:
    """A worker whose candidates after the first `after` wait for the file `release` (or an interrupt)."""
    env = _env(db_url) | {held_worker.HOLD_AFTER_ENV: str(after)}
    if release is not None:
        env[held_worker.RELEASE_ENV] = str(release)
    command = [*HELD_CLI, "worker", "--inline", *args]
    return subprocess.Popen(command, stdout=log, stderr=log, env=env, cwd=ROOT)


def _trials(db_url: str) -> dict[int, tuple[int, str]]:
    with open_store(db_url) as store:
        return {t.id: (t.sweep_id, canonical(t.config)) for t in store.trials()}


def _wait_for(what: str, check, process: subprocess.Popen, log_path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert process.poll() is None, log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, f"{what}: not in time"
        time.sleep(0.2)


def _stopped(process: subprocess.Popen, signum: int) -> int:
    try:
        os.kill(process.pid, signum)
        return process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()


def _one_sweep_with_every_trial_once(db_url: str, job_id: int) -> int:
    with open_store(db_url) as store:
        job = store.get_job(job_id)
        assert job.state == "done", job
        assert store.get_sweep(job.sweep_id).status == "done"
    configs = [config for sweep, config in _trials(db_url).values() if sweep == job.sweep_id]
    assert len(configs) == len(set(configs)) == BUDGET
    return job.attempts


def test_sigkill_mid_job_then_another_worker_resumes_it_exactly_once(db_url, tmp_path):
    _submit(db_url)
    log_path = tmp_path / "first.log"
    with open(log_path, "w") as log:
        first = _held_worker(db_url, log, after=2)  # the third candidate waits for the kill
        _wait_for("two trials recorded", lambda: len(_trials(db_url)) >= 2, first, log_path)
        assert _stopped(first, signal.SIGKILL) == -signal.SIGKILL
    before = _trials(db_url)
    with open_store(db_url) as store:
        (job,) = store.jobs()
        assert (job.state, job.stale, job.attempts) == ("running", True, 1)
    assert len(before) == 2

    second = _cli(db_url, "worker", "--inline", "--once", "--json")
    assert f"job {job.id}: its worker stopped; back in the queue" in second.stderr
    outcome = json.loads(second.stdout)  # the resumed sweep's, as `tune --json` prints it
    assert (outcome["sweep_id"], outcome["status"]) == (job.sweep_id, "done")
    assert f"resuming sweep {job.sweep_id}" in second.stderr
    assert before.items() <= _trials(db_url).items()  # no finished trial lost or rewritten
    assert _one_sweep_with_every_trial_once(db_url, job.id) == 2


@pytest.mark.postgres
def test_two_workers_started_at_once_never_both_run_the_one_job(postgres_url, tmp_path):
    # PostgreSQL, where claims run concurrently (SKIP LOCKED); SQLite serialises every write transaction,
    # and tests/queue/test_job_store.py races claimers on both.
    db_url = postgres_url
    _submit(db_url)
    logs = [tmp_path / f"worker{i}.log" for i in range(2)]
    handles = [open(path, "w") for path in logs]
    try:
        workers = [_worker(db_url, log, "--once") for log in handles]
        codes = [w.wait(timeout=120) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        for log in handles:
            log.close()
    outputs = [path.read_text() for path in logs]
    assert codes == [0, 0], outputs
    assert sum("job 1: claimed" in out for out in outputs) == 1
    with open_store(db_url) as store:
        assert len(store.sweeps()) == 1
    assert _one_sweep_with_every_trial_once(db_url, 1) == 1


def test_sigterm_puts_the_running_job_back_and_a_restarted_worker_loses_nothing(sqlite_url, tmp_path):
    db_url = sqlite_url  # the claims on PostgreSQL are tested above; this test is about the worker's stop
    first_job = _submit(db_url)
    _submit(db_url, priority=-1)  # runs after the first, finding every config of its problem done
    log_path, release = tmp_path / "first.log", tmp_path / "release"
    with open(log_path, "w") as log:
        first = _held_worker(db_url, log, release=release)  # its second candidate is in flight, held
        try:
            _wait_for("a trial recorded", lambda: len(_trials(db_url)) >= 1, first, log_path)
            first.send_signal(signal.SIGTERM)
            _wait_for("the stop seen", lambda: "stopping:" in log_path.read_text(), first, log_path)
            release.touch()  # the candidate in flight ends and is recorded
            assert first.wait(timeout=60) == 0, log_path.read_text()[-3000:]
        finally:
            if first.poll() is None:
                first.kill()
    output = log_path.read_text()
    assert "stopping: finishing the candidates in flight" in output
    assert "back in the queue; this worker stops" in output
    with open_store(db_url) as store:
        stopped = store.get_job(first_job)
        assert (stopped.state, stopped.attempts) == ("queued", 1) and stopped.sweep_id is not None
        assert store.get_sweep(stopped.sweep_id).status == "interrupted"
    before = _trials(db_url)

    restarted = _cli(db_url, "worker", "--inline", "--once")
    assert f"resuming sweep {stopped.sweep_id}" in restarted.stderr
    assert before.items() <= _trials(db_url).items()
    assert _one_sweep_with_every_trial_once(db_url, first_job) == 2
    with open_store(db_url) as store:
        assert [j.state for j in store.jobs()] == ["done", "done"]


def test_cancelling_a_running_job_stops_its_sweep_and_the_worker_goes_on(sqlite_url, tmp_path):
    # The worker's second candidate waits for the interrupt that the cancel brings: the sweep cannot end
    # on its own before the worker's heartbeat sees the cancel, however slow the machine.
    job_id = _submit(sqlite_url)
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        worker = _held_worker(sqlite_url, log, "--once")  # its second candidate waits for the cancel
        try:
            _wait_for("a trial recorded", lambda: len(_trials(sqlite_url)) >= 1, worker, log_path)
            with open_store(sqlite_url) as store:
                store.cancel_job(job_id)
            assert worker.wait(timeout=60) == 0, log_path.read_text()[-3000:]
        finally:
            if worker.poll() is None:
                worker.kill()
    output = log_path.read_text()
    assert f"job {job_id}: no longer this worker's" in output and "the queue is empty" in output
    with open_store(sqlite_url) as store:
        job = store.get_job(job_id)
        assert job.state == "cancelled"
        assert store.get_sweep(job.sweep_id).status == "interrupted"
    assert len(_trials(sqlite_url)) == 1
