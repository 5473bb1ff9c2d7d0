"""The values that travel between the sweep driver and the workers (pickled by Ray, so plain and small).

A task carries everything a worker needs (including the group sizes, so workers never read routing
files); a result carries everything the driver writes into the trial row.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import statistics
from typing import Any

from moetune.kernels.problem import Problem

OK = "ok"
PRUNED = "pruned"
COMPILE_ERROR = "compile_error"
WRONG_RESULT = "wrong_result"
TIMEOUT = "timeout"
CRASHED = "crashed"

# The error text kept in a trial row: enough for a compiler message, not a whole log.
MAX_ERROR_CHARS = 4000


def weights_key(problem: Problem, seed: int) -> tuple[Any, ...]:
    """What identifies the weight tensors made for `problem` and `seed` (its op's `weights` operands):
    problems that differ only in M share them (the input cache makes them once; the Ray executor
    prefers a worker that holds them). An op without weights (the weight gradient) shares nothing."""
    weights = tuple((o.shape(problem), o.dtype(problem)) for o in problem.spec.drawn_operands if o.weights)
    # Quantized weights come with their layout's scales: shared within one scale layout only.
    return (weights, problem.scale_layout, seed) if weights else (problem, seed)


def canonical(config: dict[str, Any]) -> str:
    """The key of a config within one problem: its JSON with sorted keys (as the store keys done_configs)."""
    return json.dumps(config, sort_keys=True)


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 15] + " ... [truncated]"


@dataclasses.dataclass(frozen=True)
class CandidateTask:
    """Compile, verify and time one config of one problem."""

    task_id: str
    backend: str
    problem: Problem
    config: dict[str, Any]
    timing_sizes: tuple[tuple[int, ...], ...]  # group sizes the candidate is timed on, one per routing
    verify_sizes: tuple[tuple[int, ...], ...]  # group sizes of each verification draw
    runs: int = 10
    seed: int = 0
    label: str = ""
    # Time with this backend's timer instead of the task's own (a baseline borrows the sweep backend's,
    # when that timer takes any JAX program), so that both sides of a speedup are timed alike.
    timer_backend: str = ""


@dataclasses.dataclass(frozen=True)
class RetimeTask:
    """Re-time finalists interleaved (A B C, B C A, ...), so drift hits every finalist alike."""

    task_id: str
    backend: str
    problem: Problem
    configs: tuple[dict[str, Any], ...]
    timing_sizes: tuple[tuple[int, ...], ...]
    rounds: int = 5
    runs_per_round: int = 4
    seed: int = 0
    label: str = ""


@dataclasses.dataclass(frozen=True)
class CompileOnlyTask:
    """Compile one config for a target device this machine does not have (Backend.compile_only)."""

    task_id: str
    backend: str
    problem: Problem
    config: dict[str, Any]
    target: str
    label: str = ""


Task = CandidateTask | RetimeTask | CompileOnlyTask


def device_work(task: Task) -> int:
    """A task's expected time on its device, in arbitrary units for comparing tasks: the FLOPs of one
    kernel launch times the launches it times (a retime's finalists, rounds and runs; a candidate's runs),
    per routing. Verification and set-up are left out; they scale alike. A compile-only task uses none."""
    if isinstance(task, CompileOnlyTask):
        return 0
    if isinstance(task, RetimeTask):
        launches = len(task.configs) * task.rounds * task.runs_per_round
    else:
        launches = task.runs
    return task.problem.flops * launches * max(1, len(task.timing_sizes))


@dataclasses.dataclass(frozen=True)
class CandidateResult:
    task_id: str
    status: str
    samples_s: tuple[float, ...] = ()
    compile_s: float | None = None
    verify_error: float | None = None
    error: str = ""
    host: str = ""
    worker: str = ""
    started_at: datetime.datetime | None = None  # compilation began
    finished_at: datetime.datetime | None = None
    device_started_at: datetime.datetime | None = None  # the device phase began: the lane was this task's
    static: dict[str, Any] | None = None  # compile-only: binary hash and static metrics (trial details)
    # Seconds per phase after compiling (candidate.PHASES; the trial details' "phases"): where a worker's
    # time went. None where the trial ended before its set-up (compile errors, compile-only, executor's).
    phases: dict[str, float] | None = None
    lane: str = ""  # the device lane the run held (the executor's name for it; trial details' "lane")
    # The kernels one call launched, each with its median seconds, where the timer sees launches (CUPTI):
    # trial details' "kernels", which of an op's kernels the time went to.
    kernels: tuple[tuple[str, float], ...] = ()

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.samples_s) if self.status == OK and self.samples_s else None


@dataclasses.dataclass(frozen=True)
class RetimeResult:
    task_id: str
    samples_s: tuple[tuple[float, ...], ...]  # per config, in task order; () for a config that failed
    error: str = ""
    host: str = ""
    worker: str = ""


Result = CandidateResult | RetimeResult


def failed(task: Task, status: str, error: str, *, worker: str = "", host: str = "") -> Result:
    """The result of a task whose worker died or hung: the executor's verdict, not the worker's."""
    if isinstance(task, RetimeTask):
        return RetimeResult(task.task_id, tuple(() for _ in task.configs), error, host, worker)
    return CandidateResult(task.task_id, status, error=error, host=host, worker=worker, finished_at=now())
