"""The Ray executor hands a GPU's lane to the next ready worker as soon as a run ends, before the driver
records that run's result (a database write, the strategy's next ask): the lane is the sweep's
bottleneck, so it must not idle while the driver works. The next worker is the one with the least device
work, unless another has waited past LANE_PATIENCE_S."""

from __future__ import annotations

import math
import time
from collections import deque
from types import SimpleNamespace

from moetune.kernels.problem import Problem
from moetune.tuner.ray_pool import LANE_PATIENCE_S, RayExecutor, _Slot
from moetune.tuner.tasks import CandidateResult, CandidateTask, CompileOnlyTask, RetimeTask, device_work


class _Run:
    def __init__(self, log: list, name: str) -> None:
        self._log, self._name = log, name

    def remote(self, task_id: str) -> str:
        self._log.append((self._name, task_id))
        return f"run-{task_id}"


class _FakeRay:
    """ray.wait / ray.get over refs that are all finished."""

    exceptions = SimpleNamespace(RayError=RuntimeError)

    def wait(self, refs, num_returns, timeout):
        return list(refs)[:num_returns], []

    def get(self, ref):
        return f"result of {ref}"


def _problem(m: int) -> Problem:
    return Problem(
        "grouped_matmul", m=m, k=4096, n=1024, g=8, lhs_dtype="bf16", rhs_dtype="bf16", out_dtype="bf16"
    )


def _slot(name: str, phase: str, log: list, task_id: str, ready_since: float = 0.0, m: int = 64) -> _Slot:
    slot = _Slot(name, SimpleNamespace(run=_Run(log, name)), phase=phase)
    slot.info = SimpleNamespace(lane="host:gpu0")
    slot.task = CandidateTask(task_id, "xla", _problem(m), {}, ((m,),), ((m,),), label=task_id)
    slot.ready_since = ready_since
    return slot


def _pool(slots: list, lanes: dict) -> RayExecutor:
    pool = object.__new__(RayExecutor)
    pool._ray, pool.timeout_s, pool._queue = _FakeRay(), 60.0, deque()
    pool._slots, pool._lanes = slots, lanes
    return pool


def test_a_finished_run_hands_its_lane_over_before_the_driver_sees_the_result():
    log: list = []
    running = _slot("w0", "run", log, "a")
    running.ref = "run-a"
    now = time.monotonic()
    later, first = _slot("w1", "ready", log, "b", now), _slot("w2", "ready", log, "c", now - 1.0)
    pool = _pool([running, later, first], {"host:gpu0": running})

    results = pool._poll(math.inf)

    assert results == ["result of run-a"]
    assert log == [("w2", "c")]  # equal work: the longer-waiting ready worker, and only one per lane
    assert pool._lanes["host:gpu0"] is first and first.phase == "run"
    assert later.phase == "ready" and running.phase == "idle"


def test_a_free_lane_goes_to_the_least_device_work_unless_someone_waited_too_long():
    log: list = []
    now = time.monotonic()
    large = _slot("w0", "ready", log, "large", now - 2.0, m=8192)
    small = _slot("w1", "ready", log, "small", now, m=16)
    pool = _pool([large, small], {"host:gpu0": None})
    pool._grant_lanes()
    assert log == [("w1", "small")] and large.phase == "ready"

    log.clear()
    large.ready_since = now - LANE_PATIENCE_S - 1.0
    other_small = _slot("w2", "ready", log, "small2", now, m=16)
    pool = _pool([large, other_small], {"host:gpu0": None})
    pool._grant_lanes()
    assert log == [("w0", "large")]  # overdue: first, whatever its size

    log.clear()
    newer = _slot("w3", "ready", log, "newer", now - LANE_PATIENCE_S - 1.0, m=16)
    older = _slot("w4", "ready", log, "older", now - LANE_PATIENCE_S - 5.0, m=8192)
    pool = _pool([newer, older], {"host:gpu0": None})
    pool._grant_lanes()
    assert log == [("w4", "older")]  # among the overdue, the longest-waiting


def test_device_work_counts_every_timed_launch():
    candidate = CandidateTask("c", "xla", _problem(256), {}, ((256,), (256,)), (), runs=10)
    retime = RetimeTask("r", "xla", _problem(256), ({}, {}, {}), ((256,), (256,)), rounds=5, runs_per_round=4)
    assert device_work(candidate) == _problem(256).flops * 10 * 2
    assert device_work(retime) == _problem(256).flops * 3 * 5 * 4 * 2
    assert device_work(candidate) < device_work(
        CandidateTask("d", "xla", _problem(512), {}, ((512,), (512,)), ())
    )
    assert device_work(CompileOnlyTask("e", "xla", _problem(512), {}, "gfx942")) == 0


def test_a_finished_run_names_the_lane_that_timed_it():
    log: list = []
    running = _slot("w0", "run", log, "a")
    running.ref = "run-a"
    pool = _pool([running], {"host:gpu0": running})
    pool._ray = SimpleNamespace(
        wait=_FakeRay().wait, get=lambda ref: CandidateResult("a", "ok"), exceptions=_FakeRay.exceptions
    )
    [result] = pool._poll(math.inf)
    assert result.lane == "host:gpu0" and pool._lanes["host:gpu0"] is None
