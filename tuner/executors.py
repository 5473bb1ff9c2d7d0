"""Executors run tasks for the sweep driver: in this process (sequentially) or on a Ray cluster.

Contract (the driver is the only caller, from one thread):
  - `capacity()` is how many more tasks `submit` takes now; the driver never submits more;
  - `wait(timeout_s)` returns the results that are finished (possibly none after `timeout_s`), each task
    exactly once: a task whose worker died or hung comes back as a crashed or timeout result, never lost;
  - `device` is the fingerprint of the device the tasks are timed on (what trial rows record);
  - `lanes()` maps each device lane (one per GPU, or the CPU) to what it is timing now, for progress;
  - `activity()` says what each worker does now (WorkerActivity), for progress: a task's phase and the
    workers' set-up; an executor without workers of its own reports none;
  - `close()` releases workers; an executor is not reused after it.
"""

from __future__ import annotations

import abc
import dataclasses
from collections import deque
from collections.abc import Callable

from moetune.kernels.device import DeviceFingerprint
from moetune.tuner.tasks import Result, Task

# What a worker does, as WorkerActivity.state says it.
STARTING = "starting"  # its process starts: importing JAX, opening the device
IDLE = "idle"
PREPARING = "preparing"  # its first task of a problem: compiling, and making the problem's inputs
COMPILING = "compiling"
WAITING = "waiting"  # compiled, waiting for its device's lane
TIMING = "timing"  # verifying and timing on the device


@dataclasses.dataclass(frozen=True)
class WorkerActivity:
    worker: str
    lane: str  # the device lane it times on ("" before it reports one)
    state: str  # one of the states above
    task_id: str = ""
    label: str = ""  # the task's label
    first_of_problem: bool = False  # its first task of this problem: inputs and references are made too


class Executor(abc.ABC):
    device: DeviceFingerprint

    @abc.abstractmethod
    def capacity(self) -> int: ...

    @abc.abstractmethod
    def submit(self, task: Task) -> None: ...

    @abc.abstractmethod
    def wait(self, timeout_s: float) -> list[Result]: ...

    @abc.abstractmethod
    def in_flight(self) -> int: ...

    def lanes(self) -> dict[str, str]:
        return {}

    def activity(self) -> list[WorkerActivity]:
        return []

    @property
    def workers(self) -> int:
        return 1

    def close(self) -> None:  # noqa: B027 - optional hook: nothing to release by default
        """Release workers."""


class InlineExecutor(Executor):
    """Runs each task to completion inside `wait`, one at a time, in this process.

    `run` defaults to a real CandidateRunner (compile, verify, time on this process's device); tests pass
    a simulated runner instead. Timeouts cannot be enforced in-process: a hanging candidate hangs the
    sweep, which is why real sweeps use the Ray executor.
    """

    def __init__(
        self, run: Callable[[Task], Result] | None = None, device: DeviceFingerprint | None = None
    ) -> None:
        if run is None or device is None:
            from moetune.kernels.device import current_fingerprint
            from moetune.tuner.candidate import CandidateRunner

            run = run or CandidateRunner("inline").evaluate
            device = device or current_fingerprint()
        self._run = run
        self.device = device
        self._queue: deque[Task] = deque()
        self._current = ""

    def capacity(self) -> int:
        return 0 if self._queue else 1

    def submit(self, task: Task) -> None:
        self._queue.append(task)

    def in_flight(self) -> int:
        return len(self._queue)

    def wait(self, timeout_s: float) -> list[Result]:
        if not self._queue:
            return []
        task = self._queue.popleft()
        self._current = task.label
        try:
            return [self._run(task)]
        finally:
            self._current = ""

    def lanes(self) -> dict[str, str]:
        return {self.device.device_kind: self._current or "idle"}
