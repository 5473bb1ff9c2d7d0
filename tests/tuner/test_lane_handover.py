"""The Ray executor hands a GPU's lane to the next ready worker as soon as a run ends, before the driver
records that run's result (a database write, the strategy's next ask): the lane is the sweep's
bottleneck, so it must not idle while the driver works."""

from __future__ import annotations

import math
from collections import deque
from types import SimpleNamespace

from moetune.tuner.ray_pool import RayExecutor, _Slot


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


def _slot(name: str, phase: str, log: list, task_id: str, ready_since: float = 0.0) -> _Slot:
    slot = _Slot(name, SimpleNamespace(run=_Run(log, name)), phase=phase)
    slot.info = SimpleNamespace(lane="host:gpu0")
    slot.task = SimpleNamespace(task_id=task_id, label=task_id)
    slot.ready_since = ready_since
    return slot


def test_a_finished_run_hands_its_lane_over_before_the_driver_sees_the_result():
    log: list = []
    pool = object.__new__(RayExecutor)
    pool._ray, pool.timeout_s, pool._queue = _FakeRay(), 60.0, deque()
    running = _slot("w0", "run", log, "a")
    running.ref = "run-a"
    later, first = _slot("w1", "ready", log, "b", 2.0), _slot("w2", "ready", log, "c", 1.0)
    pool._slots = [running, later, first]
    pool._lanes = {"host:gpu0": running}

    results = pool._poll(math.inf)

    assert results == ["result of run-a"]
    assert log == [("w2", "c")]  # the longest-waiting ready worker, and only one per lane
    assert pool._lanes["host:gpu0"] is first and first.phase == "run"
    assert later.phase == "ready" and running.phase == "idle"
