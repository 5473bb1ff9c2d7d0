"""Two GPUs of one host, on this CPU machine: a real local Ray cluster that claims 2 GPUs (and one that
claims 1, to compare), real workers, a real sweep of a backend whose device phase is slow on purpose.

Ray assigns the fake GPUs like real ones (a GPU id per worker, CUDA_VISIBLE_DEVICES); JAX computes on
the CPU. The clusters run in a child process (tests/tuner/fake_gpu_sweep.py): a process joins one Ray
cluster at a time, and the session's CPU-only cluster stays up for the other tests.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tuner import fake_gpu_sweep, slow_device_backend

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
WORKERS = 4  # two per GPU: each holds half of one, so compiling overlaps timing on every lane


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[int, dict]:
    """GPU count -> what the sweep on a cluster with that many GPUs did. The two clusters run at once,
    each in a process of its own: most of a run is Ray and its workers starting, which waits more than it
    computes."""
    folder = tmp_path_factory.mktemp("fake_gpus")
    codes = {}
    with contextlib.ExitStack() as stack:
        started = {}
        for gpus in (1, 2):
            out = folder / f"{gpus}.json"
            command = [sys.executable, "-m", "tests.tuner.fake_gpu_sweep", "--gpus", str(gpus)]
            command += ["--workers", str(WORKERS), "--db-dir", str(folder), "--out", str(out)]
            log = stack.enter_context((folder / f"{gpus}.log").open("w"))
            started[gpus] = stack.enter_context(
                subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
            )
            stack.callback(started[gpus].kill)  # on the way out, also when the other one fails or hangs
        for gpus, process in started.items():
            codes[gpus] = process.wait(timeout=300)
    for gpus, code in codes.items():
        assert code == 0, (folder / f"{gpus}.log").read_text()[-3000:]
    return {gpus: json.loads((folder / f"{gpus}.json").read_text())[str(gpus)] for gpus in codes}


def lane_of(run: dict) -> dict[str, str]:
    return {worker["name"]: worker["lane"] for worker in run["workers"]}


def device_intervals(run: dict) -> dict[str, list[tuple[float, float]]]:
    """Lane -> (start, end) of each candidate's verify + time phase, in order."""
    lanes = lane_of(run)
    intervals = collections.defaultdict(list)
    for candidate in run["sweep"]["candidates"]:
        intervals[lanes[candidate["worker"]]].append((candidate["device_start"], candidate["end"]))
    return {lane: sorted(spans) for lane, spans in intervals.items()}


def assert_never_overlap(spans: list[tuple[float, float]]) -> None:
    for (_, end), (start, _) in itertools.pairwise(sorted(spans)):
        assert start >= end, "two candidates used one GPU at the same time"


def overlap_s(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


def test_workers_are_spread_over_both_gpus_and_each_lane_is_the_gpu_ray_assigned(runs):
    two = runs[2]
    host = two["workers"][0]["lane"].split(":")[0]
    assert two["lanes"] == [f"{host}:gpu0", f"{host}:gpu1"]
    assert collections.Counter(lane_of(two).values()) == {f"{host}:gpu0": 2, f"{host}:gpu1": 2}
    # What Ray told each worker's process (CUDA_VISIBLE_DEVICES) is the lane the driver queues it on.
    lane_by_pid = {worker["pid"]: worker["lane"] for worker in two["workers"]}
    assert {t["pid"] for t in two["timings"]} == set(lane_by_pid), "every worker timed something"
    for timing in two["timings"]:
        assert lane_by_pid[timing["pid"]] == f"{host}:gpu{timing['cuda_visible_devices']}"
    # Each trial records the lane that timed it (sweep_timeline.py reads it): its worker's.
    assert all(t["lane"] == lane_of(two)[t["worker"]] for t in two["sweep"]["trials"])
    # With one GPU, all four workers share it: one lane.
    assert runs[1]["lanes"] == [f"{host}:gpu0"]
    assert {t["cuda_visible_devices"] for t in runs[1]["timings"]} == {"0"}


def test_the_two_lanes_time_in_parallel_but_each_lane_one_candidate_at_a_time(runs):
    intervals = device_intervals(runs[2])
    gpu0, gpu1 = (intervals[lane] for lane in sorted(intervals))
    for spans in (gpu0, gpu1):
        assert_never_overlap(spans)
    busy = min(sum(end - start for start, end in spans) for spans in (gpu0, gpu1))
    assert overlap_s(gpu0, gpu1) > 0.5 * busy, "the two GPUs were mostly busy at different times"
    # The timing calls themselves (re-timing included), grouped by the GPU Ray assigned: the same.
    by_gpu = collections.defaultdict(list)
    for timing in runs[2]["timings"]:
        by_gpu[timing["cuda_visible_devices"]].append((timing["start"], timing["end"]))
    assert sorted(by_gpu) == ["0", "1"]
    for spans in by_gpu.values():
        assert_never_overlap(spans)
    assert overlap_s(by_gpu["0"], by_gpu["1"]) > 0
    # One GPU: nothing ever overlaps.
    assert_never_overlap([span for spans in device_intervals(runs[1]).values() for span in spans])


def test_a_sweep_on_one_or_two_gpus_records_every_trial_once(runs):
    expected = {(p, v) for p in range(len(fake_gpu_sweep.PROBLEMS)) for v in slow_device_backend.VARIANTS}
    for gpus, run in runs.items():
        sweep = run["sweep"]
        assert sweep["status"] == "done" and sweep["winners"] == len(fake_gpu_sweep.PROBLEMS)
        problems = sorted({t["problem"] for t in sweep["trials"]})
        recorded = [(problems.index(t["problem"]), t["config"]["variant"]) for t in sweep["trials"]]
        assert sorted(recorded) == sorted(expected), f"{gpus} GPU(s): trials missing or repeated"
        assert {t["status"] for t in sweep["trials"]} == {"ok"}
    # Throughput is not compared: the two clusters share two cores at once here (lab/device/multi_gpu.sh
    # measures it on GPUs); that the two lanes work at the same time is asserted from their busy
    # intervals above.
