"""`moetune tune --dry-run`: the plan (problems x candidates after pruning) and an estimated time.

The estimate uses this backend's earlier trials on this device model when the database has some
(mean compile seconds and device seconds per candidate), and says "guess" when it does not. Compiles
overlap across workers; device time is serial per device lane:

    estimate = max(candidates * compile_s / workers, candidates * device_s / lanes)
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from moetune.kernels.device import DeviceFingerprint
from moetune.tuner.driver import SweepDriver
from moetune.tuner.executors import InlineExecutor
from moetune.tuner.plan import PlannedProblem
from moetune.tuner.spec import SweepSpec
from moetune.tuner.tasks import OK, Task, canonical

# Used when the database has no trials of this backend on this device model yet.
GUESS_COMPILE_S = 2.0
GUESS_DEVICE_S = 0.3
# Verification runs, warm-up runs and the reference: device work per candidate besides the timed runs.
EXTRA_DEVICE_RUNS = 6


@dataclasses.dataclass(frozen=True)
class PlanRow:
    label: str
    problem_key: str
    valid: int
    pruned: int
    done: int  # valid configs already timed on this device and kernel source (never re-timed)
    to_run: int
    skipped: str = ""


@dataclasses.dataclass(frozen=True)
class Plan:
    rows: list[PlanRow]
    compile_s: float
    device_s: float
    measured: bool  # False: the per-candidate costs are guesses
    workers: int
    lanes: int

    @property
    def candidates(self) -> int:
        return sum(r.to_run for r in self.rows)

    @property
    def estimate_s(self) -> float:
        return max(
            self.candidates * self.compile_s / self.workers, self.candidates * self.device_s / self.lanes
        )


def _never(task: Task) -> Any:
    raise AssertionError("a dry run runs nothing")


def make_plan(
    spec: SweepSpec,
    planned: list[PlannedProblem],
    store: Any,
    backend: str,
    device: DeviceFingerprint,
    *,
    workers: int,
    lanes: int = 1,
) -> Plan:
    driver = SweepDriver(store, InlineExecutor(_never, device), spec, backend=backend)
    rows = []
    for run in driver.prepare(planned, sweep_id=None):
        if run.phase == "skipped":
            rows.append(PlanRow(run.label, run.problem.key, 0, 0, 0, 0, run.skipped))
            continue
        valid = set(run.strategy.space.valid())
        done = sum(1 for c in valid if canonical(c.to_dict()) in run.known)
        to_run = len(valid) - done
        if spec.budget is not None:
            to_run = min(to_run, spec.budget)
        rows.append(PlanRow(run.label, run.problem.key, len(valid), run.pruned_count, done, to_run))
    compile_s, device_s, measured = _costs(store, backend, device, spec.runs)
    return Plan(rows, compile_s, device_s, measured, max(1, workers), max(1, lanes))


def _costs(store: Any, backend: str, device: DeviceFingerprint, runs: int) -> tuple[float, float, bool]:
    rows = store.trials(backend=backend, device_kind=device.device_kind, limit=500)
    compiles = [r.compile_s for r in rows if r.compile_s is not None]
    medians = [r.median_s for r in rows if r.status == OK and r.median_s is not None]
    if not compiles or not medians:
        return GUESS_COMPILE_S, GUESS_DEVICE_S, False
    return statistics.mean(compiles), statistics.mean(medians) * (runs + EXTRA_DEVICE_RUNS), True
