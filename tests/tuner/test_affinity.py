"""The Ray executor's affinity: a task goes to the idle worker most likely to hold its inputs already."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

from moetune.kernels.problem import Problem
from moetune.tuner.ray_pool import RayExecutor, _Slot, affinity
from moetune.tuner.tasks import CandidateTask

GATE_UP = {t: Problem("grouped_matmul", m=2 * t, k=4096, n=28672, g=8) for t in (16, 256)}
DOWN = Problem("grouped_matmul", m=32, k=14336, n=4096, g=8)


def task(problem: Problem, task_id: str, seed: int = 0) -> CandidateTask:
    return CandidateTask(task_id, "xla", problem, {}, ((problem.m,) + (0,) * 7,), (), seed=seed)


class _Call:
    def __init__(self, log: list, name: str) -> None:
        self._log, self._name = log, name

    def remote(self, task: CandidateTask) -> str:
        self._log.append((self._name, task.task_id))
        return f"ref-{task.task_id}"


class _Actor:
    def __init__(self, log: list, name: str) -> None:
        self.prepare = _Call(log, name)


def idle_pool(served: dict[str, list[CandidateTask]]) -> tuple[RayExecutor, list]:
    """An executor with idle workers that served the given tasks, and no Ray behind it."""
    log: list = []
    pool = object.__new__(RayExecutor)
    pool.timeout_s = 60.0
    pool._queue = deque()
    pool._lanes = {}
    pool._slots = []
    for name, tasks in served.items():
        slot = _Slot(name, _Actor(log, name), phase="idle")
        slot.served.extend(tasks)
        pool._slots.append(slot)
    return pool, log


def test_affinity_prefers_the_same_problem_then_the_same_weights():
    slot = _Slot("w", None)
    assert affinity(slot, task(DOWN, "a")) == 0
    slot.served.append(task(GATE_UP[16], "x"))
    assert affinity(slot, task(GATE_UP[16], "a")) == 2
    assert affinity(slot, task(GATE_UP[256], "a")) == 1  # same weights, another token count
    assert affinity(slot, task(GATE_UP[16], "a", seed=1)) == 0  # another seed: other operands
    assert affinity(slot, task(DOWN, "a")) == 0


def test_dispatch_sends_each_task_to_the_worker_holding_its_inputs():
    pool, log = idle_pool(
        {
            "w0": [task(DOWN, "old0")],
            "w1": [task(GATE_UP[256], "old1")],
            "w2": [task(GATE_UP[16], "old2")],
        }
    )
    for t in (task(GATE_UP[16], "a"), task(DOWN, "b"), task(GATE_UP[256], "c")):
        pool.submit(t)
    pool._dispatch()
    assert sorted(log) == [("w0", "b"), ("w1", "c"), ("w2", "a")]
    assert all(slot.phase == "prepare" for slot in pool._slots)


def test_without_affinity_tasks_go_to_idle_workers_in_order():
    pool, log = idle_pool({"w0": [], "w1": []})
    for t in (task(DOWN, "a"), task(DOWN, "b"), task(DOWN, "c")):
        pool.submit(t)
    pool._dispatch()
    assert log == [("w0", "a"), ("w1", "b")]
    assert [t.task_id for t in pool._queue] == ["c"]


def test_tasks_without_affinity_spread_over_the_devices_by_their_queued_work():
    # Workers w0, w1 time on GPU 0 and w2, w3 on GPU 1 (listed first to last, as Ray starts them).
    pool, log = idle_pool({"w0": [], "w1": [], "w2": [], "w3": []})
    for slot, lane in zip(pool._slots, ("gpu0", "gpu0", "gpu1", "gpu1"), strict=True):
        slot.info = SimpleNamespace(lane=lane)
    large, small = Problem("grouped_matmul", m=8192, k=4096, n=28672, g=8), DOWN
    for t in (task(large, "a"), task(large, "b"), task(small, "c"), task(small, "d")):
        pool.submit(t)
    pool._dispatch()
    # The two large tasks go to different GPUs; each small one then joins the GPU with less work queued.
    lane = {slot.name: slot.info.lane for slot in pool._slots}
    assert [lane[worker] for worker, _ in log] == ["gpu0", "gpu1", "gpu0", "gpu1"]
    assert {lane[worker] for worker, task_id in log if task_id in ("a", "b")} == {"gpu0", "gpu1"}
