"""What one trial of a problem costs a sweep: compile seconds on a worker plus device seconds on a lane.

    device_s = kernel_s * (runs + EXTRA_DEVICE_RUNS)
    kernel_s = scale * (flops / FLOP_RATE[platform] + bytes_touched / BYTE_RATE[platform])

Compile seconds depend on the backend, device seconds on the problem's work (its op spec's FLOPs and bytes
touched). Both are calibrated from the database's trials of the same backend on the same device model:
  1. the problem's own trials: their mean compile seconds and median kernel seconds ("history");
  2. else the problems nearest in work: their compile seconds, and their measured kernel seconds over
     the formula's, scaling the formula for this problem ("nearest");
  3. else `Backend.prior_compile_s` and the formula with scale 1 ("prior": rates a typical candidate
     reaches, well under peak; off by a small factor, which the live ETA corrects as trials finish).

A sweep's wall time for a set of trials (`wall_s`): workers compile and wait for their lane in parallel,
each lane times one candidate at a time, so it is whichever of the two is longer.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from moetune.kernels.backend import Backend
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.problem import Problem
from moetune.tuner.tasks import OK

# Verification runs, warm-up runs and the reference: device work per candidate besides the timed runs.
EXTRA_DEVICE_RUNS = 6
# FLOP/s and bytes/s a typical candidate reaches (not the peaks): the prior of kernel seconds.
FLOP_RATE = {"cpu": 2e10, "gpu": 2e14, "rocm": 2e14}
BYTE_RATE = {"cpu": 1e10, "gpu": 2e12, "rocm": 2e12}
NEAREST = 3  # problems whose trials calibrate one without trials of its own
HISTORY_LIMIT = 5000  # newest trials read


@dataclasses.dataclass(frozen=True)
class TrialCost:
    compile_s: float
    device_s: float
    basis: str  # "history" | "nearest" | "prior"

    @property
    def total_s(self) -> float:
        return self.compile_s + self.device_s


def formula_kernel_s(problem: Problem, platform: str) -> float:
    """The prior's kernel seconds: work over typical rates."""
    flop_rate, byte_rate = (
        FLOP_RATE.get(platform, FLOP_RATE["gpu"]),
        BYTE_RATE.get(platform, BYTE_RATE["gpu"]),
    )
    return problem.flops / flop_rate + problem.spec.bytes_touched(problem) / byte_rate


@dataclasses.dataclass(frozen=True)
class _Measured:
    problem: Problem
    compile_s: float | None
    kernel_s: float | None


class CostModel:
    def __init__(
        self, backend: Backend, device: DeviceFingerprint, runs: int, history: Iterable[Any] = ()
    ) -> None:
        """`history`: trial rows (moetune.db.records.TrialRow) of this backend on this device model."""
        self.backend, self.platform, self.runs = backend, device.platform, runs
        compiles: dict[str, list[float]] = defaultdict(list)
        kernels: dict[str, list[float]] = defaultdict(list)
        problems: dict[str, Problem] = {}
        for row in history:
            problems[row.problem.key] = row.problem
            if row.compile_s is not None:
                compiles[row.problem.key].append(row.compile_s)
            if row.status == OK and row.median_s is not None:
                kernels[row.problem.key].append(row.median_s)
        self._measured = {
            key: _Measured(
                problem,
                statistics.mean(compiles[key]) if compiles[key] else None,
                statistics.median(kernels[key]) if kernels[key] else None,
            )
            for key, problem in problems.items()
        }
        self._cache: dict[str, TrialCost] = {}

    @classmethod
    def from_store(cls, store: Any, backend: Backend, device: DeviceFingerprint, runs: int) -> CostModel:
        rows = store.trials(backend=backend.name, device_kind=device.device_kind, limit=HISTORY_LIMIT)
        return cls(backend, device, runs, rows)

    @property
    def measured(self) -> bool:
        return bool(self._measured)

    def cost(self, problem: Problem) -> TrialCost:
        if problem.key not in self._cache:
            self._cache[problem.key] = self._cost(problem)
        return self._cache[problem.key]

    def _cost(self, problem: Problem) -> TrialCost:
        formula = formula_kernel_s(problem, self.platform)
        own = self._measured.get(problem.key)
        if own is not None and own.compile_s is not None and own.kernel_s is not None:
            return self._trial(own.compile_s, own.kernel_s, "history")
        compile_s = own.compile_s if own is not None else None
        nearest = self._nearest(problem, lambda m: m.compile_s is not None)
        if compile_s is None and nearest:
            compile_s = statistics.mean(m.compile_s for m in nearest)
        timed = self._nearest(problem, lambda m: m.kernel_s is not None)
        if timed:
            scale = math.exp(
                statistics.mean(
                    math.log(m.kernel_s / formula_kernel_s(m.problem, self.platform)) for m in timed
                )
            )
            kernel_s = formula * scale
        else:
            kernel_s = formula
        basis = "nearest" if timed or compile_s is not None else "prior"
        return self._trial(self.backend.prior_compile_s if compile_s is None else compile_s, kernel_s, basis)

    def retime(self, problem: Problem, timed_runs: int) -> TrialCost:
        """Re-timing finalists: `timed_runs` kernel runs in all, nothing compiled (the worker holds them)."""
        cost = self.cost(problem)
        return TrialCost(0.0, cost.device_s / (self.runs + EXTRA_DEVICE_RUNS) * timed_runs, cost.basis)

    def _trial(self, compile_s: float, kernel_s: float, basis: str) -> TrialCost:
        return TrialCost(compile_s, kernel_s * (self.runs + EXTRA_DEVICE_RUNS), basis)

    def _nearest(self, problem: Problem, usable: Any) -> list[_Measured]:
        """Measured problems (other than this one) nearest in work: ratio of formula seconds in log."""
        work = formula_kernel_s(problem, self.platform)
        candidates = [m for key, m in self._measured.items() if key != problem.key and usable(m)]
        candidates.sort(key=lambda m: abs(math.log(formula_kernel_s(m.problem, self.platform) / work)))
        return candidates[:NEAREST]


def wall_s(trials: Iterable[tuple[TrialCost, float]], *, workers: int, lanes: int) -> float:
    """How long a sweep takes for (cost, how many) trials: workers in parallel, one timing per lane at a
    time."""
    total = device = 0.0
    for cost, count in trials:
        total += cost.total_s * count
        device += cost.device_s * count
    return max(total / max(1, workers), device / max(1, lanes))
