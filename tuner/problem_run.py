"""The state of one problem within a sweep: its strategy, what is known, what is in flight, its phase.

Phases: "search" (asking the strategy, within the budget) -> "retime_wanted" (finalists chosen) ->
"retime" (re-timing in flight) -> "settled" (promotion decided) -> "done" (its baseline is in too).
A problem the backend declines is "skipped" from the start. One whose re-timing failed twice settles
`incomplete`, without a decision: the sweep is then incomplete, and resuming it re-times the problem.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from moetune.kernels.backend import Backend
from moetune.kernels.config import KernelConfig
from moetune.kernels.errors import ConfigInvalid
from moetune.tuner.finalists import Decision, Finalist
from moetune.tuner.plan import PlannedProblem
from moetune.tuner.strategies import Strategy
from moetune.tuner.tasks import OK, canonical


@dataclasses.dataclass(frozen=True)
class Known:
    """A finished trial of this problem (this sweep's or an earlier one's)."""

    trial_id: int
    config: dict[str, Any]
    status: str
    median_s: float | None
    sweep_id: int | None


@dataclasses.dataclass
class ProblemRun:
    planned: PlannedProblem
    backend: Backend
    source_hash: str
    strategy: Strategy | None  # None when skipped
    timing_sizes: tuple[tuple[int, ...], ...] = ()  # one draw per routing
    verify_sizes: tuple[tuple[int, ...], ...] = ()
    routing: dict[str, Any] = dataclasses.field(default_factory=dict)
    budget: int | None = None
    valid_count: int | None = 0  # configs of the pruned grid; None: a space too large to enumerate
    pruned_count: int | None = 0
    used: int = 0  # trials this sweep has recorded for the problem (what the budget counts)
    known: dict[str, Known] = dataclasses.field(default_factory=dict)
    in_flight: dict[str, KernelConfig] = dataclasses.field(default_factory=dict)  # task id -> config
    heuristic: dict[str, Any] | None = None
    winner_trial_id: int | None = None  # the current winner's trial, when comparable (same kernel source)
    baseline: Known | None = None
    baseline_task: str | None = None
    baseline_wanted: bool = False
    phase: str = "search"
    skipped: str = ""
    decision: Decision | None = None
    incomplete: bool = False  # settled without a decision (re-timing failed twice)
    retime_task: str | None = None
    retime_finalists: list[Finalist] = dataclasses.field(default_factory=list)
    binaries: dict[str, int] = dataclasses.field(
        default_factory=dict
    )  # compile-only: binary hash -> first trial
    duplicates: int = 0

    @property
    def label(self) -> str:
        return self.planned.label

    @property
    def problem(self):
        return self.planned.problem

    def budget_left(self) -> int | None:
        if self.budget is None:
            return None
        return max(0, self.budget - self.used - len(self.in_flight))

    def observe(self, known: Known, kernels: dict[str, float] | None = None) -> None:
        """Take in a trial recorded before (an earlier sweep, or this one before a resume), with each of
        its kernels' seconds where its details hold them."""
        self.known[canonical(known.config)] = known
        try:
            config = self.backend.config_class(self.problem.op).from_dict(known.config)
        except (ConfigInvalid, TypeError):  # a config of an older Config schema: only kept as history
            return
        self.strategy.observe(config, known.median_s if known.status == OK else None)
        if kernels and known.status == OK:
            self.strategy.note_kernels(config, kernels)

    def ok_trials(self) -> list[Known]:
        return sorted(
            (k for k in self.known.values() if k.status == OK and k.median_s is not None),
            key=lambda k: k.median_s,
        )

    def best(self) -> Known | None:
        ok = self.ok_trials()
        return ok[0] if ok else None

    def median_of(self, config: dict[str, Any] | None) -> float | None:
        if config is None:
            return None
        known = self.known.get(canonical(config))
        return known.median_s if known is not None and known.status == OK else None

    def counts(self, sweep_id: int) -> dict[str, int]:
        """Trials by status that this sweep recorded."""
        counts: dict[str, int] = {}
        for known in self.known.values():
            if known.sweep_id == sweep_id:
                counts[known.status] = counts.get(known.status, 0) + 1
        return counts
