"""Devices Ray does not know: a real local Ray cluster that declares 2 units of the custom resource
`amd_gpu` (and no Ray GPUs), real workers, a real sweep of a backend that times on `amd_gpu`
("slow_amd", what flydsl declares), on this CPU machine.

Ray counts a custom resource per node and assigns no device ids, so the executor seats every worker on
one unit itself (HIP_VISIBLE_DEVICES) and names its lane after it. The cluster runs in a child process
(tests/tuner/fake_gpu_sweep.py), as in test_multi_gpu_scheduling.py.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tuner import fake_gpu_sweep, slow_device_backend
from tests.tuner.test_multi_gpu_scheduling import assert_never_overlap, device_intervals, lane_of, overlap_s

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
WORKERS = 4  # two per amd_gpu unit


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    """What the sweep on a cluster with 2 `amd_gpu` units did."""
    folder = tmp_path_factory.mktemp("fake_amd_gpus")
    out = folder / "result.json"
    command = [sys.executable, "-m", "tests.tuner.fake_gpu_sweep", "--gpus", "2", "--resource", "amd_gpu"]
    command += ["--workers", str(WORKERS), "--db-dir", str(folder), "--out", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())["2"]


def test_workers_hold_amd_gpu_and_each_lane_is_the_unit_its_workers_see(run):
    assert run["held"] == pytest.approx(2.0)  # 4 workers, half a unit each: the whole resource
    host = run["workers"][0]["lane"].split(":")[0]
    assert run["lanes"] == [f"{host}:amd_gpu0", f"{host}:amd_gpu1"]
    assert collections.Counter(lane_of(run).values()) == {f"{host}:amd_gpu0": 2, f"{host}:amd_gpu1": 2}
    # The device a worker's process sees (HIP_VISIBLE_DEVICES) is the lane the driver queues it on.
    lane_by_pid = {worker["pid"]: worker["lane"] for worker in run["workers"]}
    assert {t["pid"] for t in run["timings"]} == set(lane_by_pid), "every worker timed something"
    for timing in run["timings"]:
        assert lane_by_pid[timing["pid"]] == f"{host}:amd_gpu{timing['hip_visible_devices']}"
        assert timing["cuda_visible_devices"] == ""  # no Ray GPU was involved


def test_each_unit_times_one_candidate_at_a_time_and_the_two_units_in_parallel(run):
    intervals = device_intervals(run)
    assert len(intervals) == 2
    for spans in intervals.values():
        assert_never_overlap(spans)
    by_unit = collections.defaultdict(list)
    for timing in run["timings"]:
        by_unit[timing["hip_visible_devices"]].append((timing["start"], timing["end"]))
    assert sorted(by_unit) == ["0", "1"]
    for spans in by_unit.values():
        assert_never_overlap(spans)
    assert overlap_s(by_unit["0"], by_unit["1"]) > 0, "the two units never timed at the same time"


def test_the_sweep_records_every_trial(run):
    sweep = run["sweep"]
    assert sweep["status"] == "done" and sweep["winners"] == len(fake_gpu_sweep.PROBLEMS)
    assert len(sweep["trials"]) == len(fake_gpu_sweep.PROBLEMS) * len(slow_device_backend.VARIANTS)
    assert {t["status"] for t in sweep["trials"]} == {"ok"}
