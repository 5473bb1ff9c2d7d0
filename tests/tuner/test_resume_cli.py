"""`moetune tune` killed with SIGKILL mid-sweep, then `--resume`: no finished trial repeated, none lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from moetune.db import open_store
from moetune.tuner.tasks import canonical

pytestmark = pytest.mark.slow

PROBLEM = "m=16,k=64,n=256,g=4,dtype=bf16"
VALID = 10  # configs of the xla backend's pruned grid for PROBLEM
CLI = [sys.executable, "-c", "from moetune.cli import main; main()"]


def trials_by_id(url: str) -> dict[int, tuple[int, str]]:
    with open_store(url) as store:
        return {t.id: (t.sweep_id, canonical(t.config)) for t in store.trials()}


def test_sigkill_then_resume_repeats_nothing_and_loses_nothing(db_url, ray_cluster, tmp_path):
    from moetune.kernels import registry
    from moetune.kernels.device import current_fingerprint
    from moetune.tuner.plan import parse_problem

    problem = parse_problem(PROBLEM).problem
    space = registry.get("xla").search_space(problem, current_fingerprint())
    assert len(space.enumerate(problem, current_fingerprint())[0]) == VALID

    tune = ["tune", "--ray-address", ray_cluster, "--workers", "2"]
    env = os.environ | {"MOETUNE_DB": db_url}  # not --db: the CLI refuses a password on its command line
    open_store(db_url).close()  # create the schema now, so that polling never races the CLI's migration
    log = open(tmp_path / "first.log", "w")
    first = subprocess.Popen(
        [*CLI, *tune, "--problem", PROBLEM, "--backend", "xla", "--no-baseline"],
        stdout=log,
        stderr=log,
        env=env,
    )
    try:
        deadline = time.monotonic() + 180
        before: dict[int, tuple[int, str]] = {}
        while len(before) < 3:
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the sweep recorded no trials in time"
            time.sleep(0.5)
            before = trials_by_id(db_url)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
        log.close()
    before = trials_by_id(db_url)  # whatever was committed until the kill
    [sweep_id] = {sweep for sweep, _ in before.values()}
    with open_store(db_url) as store:
        killed = store.get_sweep(sweep_id)
        # It never got to finish; its process is gone from this host, so it shows as dead at once.
        assert (killed.stored_status, killed.status) == ("running", "dead")
    assert len(before) < VALID

    resumed = subprocess.run(
        [*CLI, *tune, "--resume", str(sweep_id)], capture_output=True, text=True, timeout=300, env=env
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"winners of sweep {sweep_id}" in resumed.stdout
    after = trials_by_id(db_url)
    assert before.items() <= after.items()  # no finished trial lost or rewritten
    configs = [config for sweep, config in after.values() if sweep == sweep_id]
    assert len(configs) == len(set(configs)) == VALID  # none repeated, all done
    with open_store(db_url) as store:
        assert store.get_sweep(sweep_id).status == "done"
        winners = store.winners(backend="xla")
    assert [w.problem.m for w in winners] == [16]
