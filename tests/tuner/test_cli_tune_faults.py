"""`moetune tune` when it cannot simply run: a sweep another process runs, a device another sweep times on,
a re-timing that fails twice, a database that stops accepting writes. Each ends with one line on stderr
and its own exit code (cli/tune.py). Simulated workers in-process: no Ray, no device."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from moetune.cli import _load_commands, app
from moetune.db import open_store
from moetune.db.errors import DatabaseError
from moetune.db.leases import Owner
from moetune.db.store import Store
from moetune.tuner import sweep_setup
from moetune.tuner.candidate import CandidateRunner
from moetune.tuner.executors import InlineExecutor
from moetune.tuner.tasks import CRASHED, CompileOnlyTask, RetimeTask, failed
from tests.db.db_factories import age_heartbeat, set_immutable
from tests.tuner import sim_backend
from tests.tuner.test_driver import DEVICE

_load_commands()
PROBLEM = "m=8,k=64,n=64,g=4,dtype=bf16"


@pytest.fixture
def workers(monkeypatch, sim):
    """`moetune tune` gets simulated workers on DEVICE; the test may swap the runner."""
    runner = {"run": sim_backend.simulate}
    compiler = CandidateRunner("w0")  # compile-only tasks compile for real (sim_backend.compile_only)

    def run(task):
        return compiler.evaluate(task) if isinstance(task, CompileOnlyTask) else runner["run"](task)

    executor = lambda spec, inline=False, on_starting=None: (InlineExecutor(run, DEVICE), False)  # noqa: E731
    monkeypatch.setattr(sweep_setup, "make_executor", executor)
    return runner


def tune(db_url, *args):
    new = [] if "--resume" in args else ["--no-baseline"]  # a resumed sweep keeps its own settings
    return CliRunner().invoke(app, ["tune", "--db", db_url, *new, *args])


def error_line(result) -> str:
    """The one `error:` line on stderr (and no traceback)."""
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    return errors[0]


def live_sweep(db_url) -> int:
    """A timing sweep of PROBLEM with 2 trials done, running again on DEVICE for a live process (this
    one), as if another `moetune tune --resume` were at work on it."""
    result = tune(db_url, "--problem", PROBLEM, "--backend", "sim", "--budget", "2")
    assert result.exit_code == 0, result.output
    with open_store(db_url) as store:
        [sweep] = store.sweeps(limit=1)
        holder = Owner.here()
        store.acquire_sweep(sweep.id, holder)
        store.claim_device(sweep.id, holder, DEVICE)
    return sweep.id


def test_a_second_resumer_is_refused_naming_the_owner_and_writes_nothing(db_url, workers):
    sweep_id = live_sweep(db_url)
    with open_store(db_url) as store:
        trials = len(store.trials())
    result = tune(db_url, "--resume", str(sweep_id))
    assert result.exit_code == 2, result.output
    line = error_line(result)
    assert f"sweep {sweep_id} is running on {Owner.here().host}:" in line and "s ago" in line
    with open_store(db_url) as store:
        assert len(store.trials()) == trials and store.get_sweep(sweep_id).status == "running"


def test_a_dead_sweep_is_taken_over_by_resume(db_url, workers):
    sweep_id = live_sweep(db_url)
    age_heartbeat(db_url, sweep_id, 3600)  # its owner has been silent for an hour
    with open_store(db_url) as store:
        assert store.get_sweep(sweep_id).status == "dead"
    result = tune(db_url, "--resume", str(sweep_id))
    assert result.exit_code == 0, result.output
    with open_store(db_url) as store:
        row = store.get_sweep(sweep_id)
        assert row.status == "done" and row.trials == 2  # its budget was spent: nothing repeated


def test_a_second_timing_sweep_on_one_device_is_refused_unless_forced(db_url, workers):
    live_sweep(db_url)
    with open_store(db_url) as store:
        before = len(store.sweeps())
    refused = tune(db_url, "--problem", PROBLEM.replace("m=8", "m=16"), "--backend", "sim")
    assert refused.exit_code == 2, refused.output
    assert "another sweep times on this device" in error_line(refused) and "--force" in error_line(refused)
    with open_store(db_url) as store:
        assert len(store.sweeps()) == before  # nothing written
    compile_only = tune(db_url, "--problem", PROBLEM, "--backend", "sim", "--compile-only")
    assert compile_only.exit_code == 0, compile_only.output  # compiles only: disturbs no timing
    forced = tune(db_url, "--problem", PROBLEM.replace("m=8", "m=16"), "--backend", "sim", "--force")
    assert forced.exit_code == 0, forced.output


def test_a_resumed_sweep_claims_its_device_too(db_url, workers):
    live_sweep(db_url)
    first = tune(db_url, "--problem", PROBLEM.replace("m=8", "m=32"), "--backend", "sim", "--force")
    assert first.exit_code == 0, first.output
    with open_store(db_url) as store:
        [resumable, *_] = store.sweeps()  # done: its lease ended with it
    refused = tune(db_url, "--resume", str(resumable.id))
    assert refused.exit_code == 2 and "another sweep times on this device" in error_line(refused)
    with open_store(db_url) as store:  # refused before it started: its lease is let go, nothing else changed
        row = store.get_sweep(resumable.id)
        assert (row.status, row.heartbeat_age_s, row.trials) == ("done", None, resumable.trials)


def test_a_re_timing_that_fails_twice_exits_3_naming_the_problem(db_url, workers):
    def retime_dies(task):
        if isinstance(task, RetimeTask):
            return failed(task, CRASHED, "worker w0 failed while verifying and timing: killed")
        return sim_backend.simulate(task)

    workers["run"] = retime_dies
    result = tune(db_url, "--problem", PROBLEM, "--backend", "sim", "--json")
    assert result.exit_code == 3, result.output
    line = error_line(result)
    assert "is incomplete: re-timing failed twice for m=8,k=64,n=64,g=4" in line and "--resume" in line
    with open_store(db_url) as store:
        [sweep] = store.sweeps()
        assert sweep.status == "incomplete" and store.winners(backend="sim") == []
    workers["run"] = sim_backend.simulate
    resumed = tune(db_url, "--resume", str(sweep.id))
    assert resumed.exit_code == 0, resumed.output
    with open_store(db_url) as store:
        assert store.get_sweep(sweep.id).status == "done" and len(store.winners(backend="sim")) == 1


def test_a_database_that_stops_accepting_writes_exits_4_with_one_line(db_url, workers, monkeypatch):
    record = Store.record_trial
    written = []

    def record_until_full(self, rec, **kwargs):
        if len(written) == 3:
            raise DatabaseError("database sqlite:///moetune.db: attempt to write a readonly database")
        written.append(rec)
        return record(self, rec, **kwargs)

    monkeypatch.setattr(Store, "record_trial", record_until_full)
    result = tune(db_url, "--problem", PROBLEM, "--backend", "sim")
    assert result.exit_code == 4, result.output
    line = error_line(result)
    assert "failed: database" in line and "readonly database" in line and "--resume" in line
    assert "winners of sweep" not in result.output  # no outcome printed as if it had finished
    monkeypatch.undo()
    with open_store(db_url) as store:
        [sweep] = store.sweeps()
        assert sweep.status == "failed" and sweep.trials == 3


def test_a_database_file_made_immutable_mid_sweep_fails_the_sweep_and_keeps_its_trials(
    sqlite_url, tmp_path, workers, monkeypatch
):
    """The file stops taking writes while commits still succeed into SQLite's -wal: the sweep must not
    end well (with its data in the -wal alone, on its way to SIGBUS once the -wal's index outgrows it)."""
    path = tmp_path / "moetune.db"
    record = Store.record_trial

    def record_then_freeze(self, rec, **kwargs):
        trial_id = record(self, rec, **kwargs)
        if trial_id == 3:
            set_immutable(path, True)
        return trial_id

    monkeypatch.setattr(Store, "record_trial", record_then_freeze)
    try:
        result = tune(sqlite_url, "--problem", PROBLEM, "--backend", "sim")
    finally:
        set_immutable(path, False)
    assert result.exit_code == 4, result.output
    assert "failed: database" in error_line(result) and "winners of sweep" not in result.output
    monkeypatch.undo()
    with open_store(sqlite_url) as store:  # what reached the -wal is there, and the sweep is failed
        [sweep] = store.sweeps()
        assert sweep.status == "failed" and sweep.trials == len(sim_backend.TILES)


def _postgres_cluster(url: str) -> tuple[str, str]:
    """(version, name) of the local PostgreSQL cluster serving `url`, which this test may restart (root
    with pg_ctlcluster, as in CI); skips the test elsewhere."""
    import shutil

    import sqlalchemy as sa

    port = sa.make_url(url).port or 5432
    if os.geteuid() != 0 or shutil.which("pg_lsclusters") is None:
        pytest.skip("restarting PostgreSQL takes root and pg_ctlcluster")
    listed = subprocess.run(["pg_lsclusters", "--no-header"], capture_output=True, text=True, check=True)
    for line in listed.stdout.splitlines():
        version, name, cluster_port, *_ = line.split()
        if int(cluster_port) == port:
            return version, name
    pytest.skip(f"no local PostgreSQL cluster on port {port}")


@pytest.mark.postgres
@pytest.mark.slow
def test_a_postgres_restart_mid_sweep_loses_and_repeats_no_trial(postgres_alone, workers, monkeypatch):
    """The server goes down for 2.5 s just before a trial is written: that write, the heartbeat and the
    rest wait for it (connection refused, then 57P03 while it starts) and the sweep ends done. It holds the
    server alone: another test process's test would meet the restart."""
    postgres_url = postgres_alone
    version, name = _postgres_cluster(postgres_url)
    control = ["pg_ctlcluster", version, name]
    record = Store.record_trial
    written: list[int] = []
    restart: list[threading.Thread] = []

    def record_across_a_restart(self, rec, **kwargs):
        if len(written) == 3 and not restart:
            subprocess.run([*control, "stop", "-m", "fast"], check=True)
            restart.append(threading.Timer(2.5, subprocess.run, ([*control, "start"],), {"check": True}))
            restart[0].start()
        written.append(record(self, rec, **kwargs))
        return written[-1]

    monkeypatch.setattr(Store, "record_trial", record_across_a_restart)
    try:
        result = tune(postgres_url, "--problem", PROBLEM, "--backend", "sim")
    finally:
        for thread in restart:
            thread.join()
        subprocess.run([*control, "start"], capture_output=True)  # up again whatever happened ("already")
    assert restart and result.exit_code == 0, result.output
    monkeypatch.undo()
    with open_store(postgres_url) as store:
        [sweep] = store.sweeps()
        recorded = store.trials(sweep_id=sweep.id)
    assert sweep.status == "done"
    configs = sorted(row.config["tile"] for row in recorded)
    assert configs == sorted(set(configs)) == list(sim_backend.TILES)  # none lost, none twice


@pytest.mark.slow
def test_a_wal_and_shm_made_read_only_mid_sweep_end_it_in_one_line_without_a_signal(tmp_path):
    """SQLite writes its -shm index through a memory map: a write there once the file refuses writes is
    SIGBUS (exit 135, a dump), so the files are checked before each transaction and never checkpointed
    after they failed. Run in a child process, which SIGBUS would kill (tests/tuner/wal_fault_sweep.py)."""
    path = tmp_path / "moetune.db"
    scratch = tmp_path / "scratch"
    scratch.touch()
    if os.geteuid() == 0:
        set_immutable(scratch, True)  # skips where chattr cannot work
        set_immutable(scratch, False)
    env = {k: v for k, v in os.environ.items() if k != "MOETUNE_DB"}
    env |= {"JAX_PLATFORMS": "cpu", "XDG_DATA_HOME": str(tmp_path / "xdg")}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.tuner.wal_fault_sweep", str(path)],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            cwd=Path(__file__).resolve().parents[2],
        )
    finally:
        for side in ("-wal", "-shm"):
            if Path(f"{path}{side}").exists():
                set_immutable(Path(f"{path}{side}"), False)
                os.chmod(f"{path}{side}", 0o644)
    assert done.returncode == 4, (done.returncode, done.stderr[-3000:])
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "-wal stopped taking writes" in errors[0], done.stderr
    assert "Traceback" not in done.stderr and "Fatal Python error" not in done.stderr
    with open_store(f"sqlite:///{path}") as store:  # the trials before the freeze are there
        [sweep] = store.sweeps()
        assert sweep.trials >= 3
