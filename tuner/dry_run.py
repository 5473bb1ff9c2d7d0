"""`moetune tune --dry-run`: the plan (problems x candidates after pruning) and an estimated time.

Each problem's candidates are costed by the per-trial cost model (tuner/cost_model.py: compile seconds
by backend, device seconds by the problem's FLOPs and bytes, calibrated from the database's trials of the
same backend and device model), so a sweep of a large model is not estimated from a tiny model's
trials. The sweep's time is cost_model.wall_s over every candidate to run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from moetune.kernels import registry
from moetune.kernels.device import DeviceFingerprint
from moetune.tuner import cost_model
from moetune.tuner.cost_model import CostModel, TrialCost
from moetune.tuner.driver import SweepDriver
from moetune.tuner.executors import InlineExecutor
from moetune.tuner.plan import PlannedProblem
from moetune.tuner.spec import SweepSpec
from moetune.tuner.tasks import Task, canonical


@dataclasses.dataclass(frozen=True)
class PlanRow:
    label: str
    problem_key: str
    valid: int | None  # None: a space too large to enumerate (tuner/strategies/base.py), only sampled
    pruned: int | None
    done: int  # valid configs already timed on this device and kernel source (never re-timed)
    to_run: int
    skipped: str = ""  # the plan's note: why a problem is skipped, or that its space is only sampled
    compile_s: float = 0.0  # per candidate, from the cost model
    device_s: float = 0.0
    basis: str = ""  # the cost model's: "history", "nearest" or "prior"
    op: str = ""
    tokens: int | None = None  # T, where the problem came from a model (m = T x top_k)
    m: int = 0
    kng: str = ""  # "k,n,g"
    filled_rows: int | None = None  # the rows routings fill when fewer than m (PlannedProblem.filled_rows)


@dataclasses.dataclass(frozen=True)
class Plan:
    rows: list[PlanRow]
    workers: int
    lanes: int

    @property
    def candidates(self) -> int:
        return sum(r.to_run for r in self.rows)

    @property
    def measured(self) -> bool:
        """Whether any candidate's cost comes from earlier trials (False: all from the prior)."""
        return any(r.basis in ("history", "nearest") for r in self.rows if r.to_run)

    @property
    def estimate_s(self) -> float:
        trials = [(TrialCost(r.compile_s, r.device_s, r.basis), r.to_run) for r in self.rows]
        return cost_model.wall_s(trials, workers=self.workers, lanes=self.lanes)


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
    costs = CostModel.from_store(store, registry.get(backend), device, spec.runs)
    rows = []
    for run in driver.prepare(planned, sweep_id=None):
        p, known = run.problem, run.planned
        shape = dict(
            op=p.op, tokens=known.tokens, m=p.m, kng=f"{p.k},{p.n},{p.g}", filled_rows=known.filled_rows
        )
        if run.phase == "skipped":
            rows.append(PlanRow(run.label, run.problem.key, 0, 0, 0, 0, run.skipped, **shape))
            continue
        space, note = run.strategy.space, ""
        if space.enumerable:
            valid = set(space.valid())
            done = sum(1 for c in valid if canonical(c.to_dict()) in run.known)
            to_run = len(valid) - done
            if spec.budget is not None:
                to_run = min(to_run, spec.budget)
        else:
            done, to_run = len(run.known), spec.budget or 0
            note = f"{space.space.size:,} points, sampled: the budget or time limit ends it"
        cost = costs.cost(run.problem)
        rows.append(
            PlanRow(
                run.label,
                run.problem.key,
                run.valid_count,
                run.pruned_count,
                done,
                to_run,
                note,
                compile_s=cost.compile_s,
                device_s=cost.device_s,
                basis=cost.basis,
                **shape,
            )
        )
    return Plan(rows, max(1, workers), max(1, lanes))
