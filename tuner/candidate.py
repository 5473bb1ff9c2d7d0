"""Evaluating tasks inside one worker process: compile (CPU), then verify and time (the device).

The two phases are separate calls because they need different resources: `prepare` lowers and compiles
and may run in parallel with other workers; `run` executes on the device and is what the executor
serialises per device, so no two timings (or a verification next to a timing) ever overlap there. A JAX
executable cannot move between processes, so both phases run in the same worker; the executable waits
in between inside a `Prepared`.

Exceptions map to statuses by phase and type, never by message text: anything raised while building
or compiling is a compile_error; WrongResult while verifying is a wrong_result; anything else raised
on the device is `crashed` (the worker survived, the kernel did not). A worker that dies or hangs is
classified by the executor.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import os
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax

from moetune.kernels import registry
from moetune.kernels.errors import ConfigInvalid, WrongResult
from moetune.kernels.problem import Problem
from moetune.kernels.timing import Timer
from moetune.tuner import verify
from moetune.tuner.input_cache import InputCache
from moetune.tuner.tasks import (
    COMPILE_ERROR,
    CRASHED,
    OK,
    PRUNED,
    WRONG_RESULT,
    CandidateResult,
    CandidateTask,
    CompileOnlyTask,
    Result,
    RetimeResult,
    RetimeTask,
    Task,
    error_text,
    now,
)


@dataclasses.dataclass
class Prepared:
    """A task whose executables are compiled and wait for the device."""

    task: Task
    executables: list[Callable[..., Any] | None]  # per config; None where compilation failed
    errors: list[str]
    compile_s: float
    started_at: datetime.datetime
    setup: dict[str, float] = dataclasses.field(default_factory=dict)  # _warm's phases
    ready_at: float = 0.0  # time.perf_counter() when `prepare` ended: the lane wait starts there
    compile_in_run: bool = False  # the backend compiles on the device: `run` compiles, holding the lane
    lane_at: float = 0.0  # when `run` began: the device's lane is held from there
    device_started_at: datetime.datetime | None = None  # the same moment, as the trial records it


# A trial's phases after compiling, in seconds (CandidateResult.phases, the trial details' "phases"):
#   setup_s            all of _warm, of which the parts below (each 0 when the cache already held it):
#   setup_inputs_s     making the problem's operands;
#   setup_reference_s  compiling the float32 reference program (it runs in `run`: see verify.warm);
#   setup_check_s      compiling (and running once) the check's programs;
#   setup_rotation_s   the timer's rotations of the timing routings;
#   lane_wait_s        from the end of `prepare` to the start of `run` in this worker: waiting for the
#                      device's exclusive lane, plus the driver's and Ray's latency (a backend that
#                      compiles on the device compiles after it, holding the lane: compile_s);
#   verify_s, time_s   verifying on every draw (on a worker's first trial of a problem, making its
#                      references too), timing on every routing (until the failure, if any).
SETUP_PARTS = ("setup_inputs_s", "setup_reference_s", "setup_check_s", "setup_rotation_s")
PHASES = ("setup_s", *SETUP_PARTS, "lane_wait_s", "verify_s", "time_s")


@contextlib.contextmanager
def _timed_if_made(
    phases: dict[str, float], name: str, made: collections.Counter[str], kind: str
) -> Iterator[None]:
    """Add the block's seconds to `phases[name]` when it made a `kind` (the cache's `made` count grew)."""
    before, started = made[kind], time.perf_counter()
    yield
    if made[kind] != before:
        phases[name] += time.perf_counter() - started


def compile_config(backend_name: str, problem: Problem, config: dict[str, Any]) -> Callable[..., Any]:
    """Build the backend's kernel for `config` and compile it for the input shapes (no device work)."""
    backend = registry.get(backend_name)
    backend.check(problem)
    kernel_config = backend.config_class(problem.op).from_dict(config)
    kernel = backend.build(problem, kernel_config)
    compiled = jax.jit(kernel).lower(*verify.shape_dtypes(problem)).compile()
    return backend.executable(problem, kernel_config, compiled)


class CandidateRunner:
    """Runs tasks in this process. One per worker; keeps recent problems' inputs, references and timing
    rotations between tasks (`cache`), so a candidate's device phase is its own kernel's work."""

    def __init__(self, worker: str = "", cache: InputCache | None = None) -> None:
        self.worker = worker or f"pid{os.getpid()}"
        self.host = socket.gethostname()
        self.cache = cache if cache is not None else InputCache()
        self._timers: dict[str, Timer] = {}

    def _timer(self, backend: str) -> Timer:
        """One timer per backend for the runner's life: the cache keys its rotations by timer."""
        if backend not in self._timers:
            self._timers[backend] = registry.get(backend).timer()
        return self._timers[backend]

    def prepare(self, task: Task) -> Prepared | Result:
        """Compile every config of `task` (in `run` instead when the backend compiles on the device) and
        make what its problem needs; a CandidateTask that fails to compile is finished (compile_error),
        and a CompileOnlyTask always is (it never reaches a device)."""
        started = now()
        if isinstance(task, CompileOnlyTask):
            return self._compile_only(task, started)
        prepared = Prepared(task, [], [], 0.0, started)
        try:
            prepared.compile_in_run = registry.get(task.backend).compiles_on_device()
        except Exception:  # noqa: S110 - compile_config meets the same failure and records it (compile_error)
            pass
        if not prepared.compile_in_run and (failed := self._compile(prepared)) is not None:
            return failed
        prepared.setup = self._warm(task)
        prepared.ready_at = time.perf_counter()
        return prepared

    def _compile(self, prepared: Prepared) -> CandidateResult | None:
        """Compile every config of the task into `prepared`; the finished result when a CandidateTask's
        one config fails (compile_error), else None."""
        task = prepared.task
        configs = task.configs if isinstance(task, RetimeTask) else (task.config,)
        t0 = time.perf_counter()
        for config in configs:
            try:
                prepared.executables.append(compile_config(task.backend, task.problem, config))
                prepared.errors.append("")
            except Exception as e:  # the edge where a failure becomes data (the trial's status)
                prepared.executables.append(None)
                prepared.errors.append(error_text(e))
        prepared.compile_s = time.perf_counter() - t0
        if isinstance(task, CandidateTask) and prepared.executables[0] is None:
            error = prepared.errors[0]
            return self._ended(task, COMPILE_ERROR, prepared.started_at, prepared.compile_s, error=error)
        return None

    def _warm(self, task: CandidateTask | RetimeTask) -> dict[str, float]:
        """Make the problem's inputs and timing rotations now, and compile the programs that make the
        references and check results, so that `run` compiles nothing.

        On a GPU each of those programs compiles on first use (seconds each, for every new problem in every
        worker); in `run` that would hold the device's lane, which serialises all workers on it. Here it
        overlaps with other workers' timing, so the device work here must stay small (random operands,
        copies for small problems, the check's warm-up): the float32 references are run in `run`. On the
        H200 they ran here once, and the largest problems' references beside other workers' timings
        inflated those timings up to threefold.

        Returns the seconds it took, as setup_s and its SETUP_PARTS.
        """
        phases = dict.fromkeys(SETUP_PARTS, 0.0)
        started = time.perf_counter()
        try:
            with _timed_if_made(phases, "setup_inputs_s", self.cache.made, "inputs"):
                inputs = self.cache.inputs(task.problem, task.seed)
            if isinstance(task, CandidateTask):
                phases["setup_reference_s"], phases["setup_check_s"] = verify.warm(inputs, self.cache)
            timer = self._task_timer(task)
            for sizes in task.timing_sizes:
                with _timed_if_made(phases, "setup_rotation_s", self.cache.made, "rotation"):
                    self.cache.rotation(inputs, sizes, timer)
        except Exception:  # noqa: S110 - `run` meets the same failure again and records it with its phase
            pass
        phases["setup_s"] = time.perf_counter() - started
        return phases

    def run(self, prepared: Prepared) -> Result:
        """Verify and time (CandidateTask) or re-time interleaved (RetimeTask) on this process's device;
        compile first when the backend compiles on the device (`compile_in_run`)."""
        try:
            prepared.lane_at, prepared.device_started_at = time.perf_counter(), now()
            if prepared.compile_in_run and (failed := self._compile(prepared)) is not None:
                lane = {"lane_wait_s": prepared.lane_at - prepared.ready_at}
                return dataclasses.replace(
                    failed, device_started_at=prepared.device_started_at, phases=prepared.setup | lane
                )
            if isinstance(prepared.task, RetimeTask):
                return self._retime(prepared)
            return self._verify_and_time(prepared)
        finally:
            self.cache.trim()

    def _verify_and_time(self, prepared: Prepared) -> CandidateResult:
        task: CandidateTask = prepared.task
        fn = prepared.executables[0]
        device_started = prepared.device_started_at
        clock = time.perf_counter()
        phases = prepared.setup | {"lane_wait_s": prepared.lane_at - prepared.ready_at}
        stage = "verify"
        try:
            inputs = self.cache.inputs(task.problem, task.seed)
            verify_error = verify.verify(fn, inputs, self.cache, task.verify_sizes)
            phases["verify_s"], clock = time.perf_counter() - clock, time.perf_counter()
            stage = "time"
            samples, kernels = self._time_on_routings(
                self._task_timer(task), fn, inputs, task.timing_sizes, task.runs, warmed=True
            )
            phases["time_s"] = time.perf_counter() - clock
        except WrongResult as e:
            phases[f"{stage}_s"] = time.perf_counter() - clock
            return self._result(task, WRONG_RESULT, prepared, device_started, error=str(e), phases=phases)
        except Exception as e:  # a kernel that raised on the device; the worker itself is fine
            phases[f"{stage}_s"] = time.perf_counter() - clock
            error = f"raised during {stage}: {error_text(e)}"
            return self._result(task, CRASHED, prepared, device_started, error=error, phases=phases)
        return self._result(
            task,
            OK,
            prepared,
            device_started,
            samples_s=tuple(samples),
            verify_error=verify_error,
            phases=phases,
            kernels=kernels,
        )

    def _task_timer(self, task: CandidateTask | RetimeTask) -> Timer:
        """The task's own backend's timer, or the one it borrows (`timer_backend`) when that can time it."""
        borrowed = getattr(task, "timer_backend", "")
        if borrowed:
            timer = self._timer(borrowed)
            if timer.times_any_jax_program:
                return timer
        return self._timer(task.backend)

    def _time_on_routings(
        self,
        timer: Timer,
        fn: Callable[..., Any],
        inputs: Any,
        timing_sizes: tuple[tuple[int, ...], ...],
        runs: int,
        *,
        warmed: bool,
    ) -> tuple[list[float], tuple[tuple[str, float], ...]]:
        """`runs` samples, each the mean over the routings of one run on each (paired by run index): an
        estimate of the time per call when calls come in those routings alike, whose median is robust; and
        the timer's kernels where it sees them (Timed.kernels). `warmed`: `fn` ran already (verified, or
        timed in an earlier round): no warm-up pass."""
        rotations = [self.cache.rotation(inputs, sizes, timer) for sizes in timing_sizes]
        timed = timer.time_kernels(fn, rotations, runs=runs, warmed=warmed)
        return [sum(run) / len(run) for run in zip(*timed.samples, strict=True)], timed.kernels

    def _compile_only(self, task: CompileOnlyTask, started: datetime.datetime) -> CandidateResult:
        backend = registry.get(task.backend)
        t0 = time.perf_counter()
        try:
            config = backend.config_class(task.problem.op).from_dict(task.config)
            static = backend.compile_only(task.problem, config, task.target)
        except ConfigInvalid as e:  # a rule of the plan, known before compiling
            status, error, static = PRUNED, str(e), None
        except Exception as e:  # the edge where a compiler failure becomes data
            status, error, static = COMPILE_ERROR, error_text(e), None
        else:
            status, error = (PRUNED, static.pruned) if static.pruned else (OK, "")
        compile_s = static.compile_s if static is not None else time.perf_counter() - t0
        facts = (
            {"target": task.target, "binary_hash": static.binary_hash, "metrics": static.metrics}
            if static
            else None
        )
        return self._ended(task, status, started, compile_s, error=error, static=facts)

    def evaluate(self, task: Task) -> Result:
        """Both phases back to back: the in-process (sequential) path."""
        prepared = self.prepare(task)
        return self.run(prepared) if isinstance(prepared, Prepared) else prepared

    def _retime(self, prepared: Prepared) -> RetimeResult:
        task: RetimeTask = prepared.task
        inputs = self.cache.inputs(task.problem, task.seed)
        samples: list[list[float]] = [[] for _ in task.configs]
        live = [i for i, fn in enumerate(prepared.executables) if fn is not None]
        errors = [e for e in prepared.errors if e]
        for round_index in range(task.rounds):
            # Rotate the order each round: A B C, B C A, C A B, ...
            shift = round_index % max(len(live), 1)
            for i in live[shift:] + live[:shift]:
                try:
                    samples[i] += self._time_on_routings(
                        self._task_timer(task),
                        prepared.executables[i],
                        inputs,
                        task.timing_sizes,
                        task.runs_per_round,
                        warmed=round_index > 0,
                    )[0]
                except Exception as e:  # one finalist failing must not cost the others their numbers
                    errors.append(error_text(e))
                    live.remove(i)
                    samples[i] = []
        return RetimeResult(
            task.task_id, tuple(tuple(s) for s in samples), "; ".join(errors), self.host, self.worker
        )

    def _result(
        self,
        task: CandidateTask,
        status: str,
        prepared: Prepared,
        device_started: datetime.datetime,
        **fields: Any,
    ) -> CandidateResult:
        return self._ended(
            task, status, prepared.started_at, prepared.compile_s, device_started_at=device_started, **fields
        )

    def _ended(
        self,
        task: CandidateTask | CompileOnlyTask,
        status: str,
        started_at: datetime.datetime,
        compile_s: float,
        **fields: Any,
    ) -> CandidateResult:
        """The result of `task`, finished now in this worker."""
        return CandidateResult(
            task.task_id,
            status,
            compile_s=compile_s,
            host=self.host,
            worker=self.worker,
            started_at=started_at,
            finished_at=now(),
            **fields,
        )
