"""The live ETA: the cost model's seconds for the work left (tuner/cost_model.py), corrected by how fast
this sweep runs against the same model.

    pace = (prior + elapsed) / (prior + predicted seconds of the work done)
    ETA  = pace * predicted seconds of the work left

`prior` is PRIOR_WEIGHT of the first prediction of the whole sweep, in seconds: before any trial ends the
ETA is the cost model's, and the sweep's own pace takes over as its work is done (by the time about that
share of it is). Each problem's work left is scaled by how its own trials ran against the model relative
to all trials (each task's seconds from submission to result over its predicted seconds; queueing, common
to all, cancels), shrunk toward 1 by PRIOR_TRIALS: small problems the model overestimates do not inherit
the pace of the large ones.

Work in flight counts as done up to its predicted cost, so a task running longer than predicted slows the
pace while it runs, and one finishing early speeds it when it ends: the ETA moves with the evidence, by
no more than what the last readings showed, weighed against `prior`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from moetune.tuner import cost_model
from moetune.tuner.cost_model import TrialCost

PRIOR_WEIGHT = 0.25
PRIOR_TRIALS = 2.0


class Eta:
    def __init__(self, *, workers: int, lanes: int) -> None:
        self.workers, self.lanes = max(1, workers), max(1, lanes)
        self._running: dict[str, tuple[TrialCost, float, str]] = {}  # task id -> cost, submitted, group
        self._done: list[tuple[TrialCost, float]] = []
        self._prior_s: float | None = None
        # group (a problem's key) -> [predicted, taken] task seconds of its finished tasks
        self._taken: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])

    def started(self, task_id: str, cost: TrialCost, now: float, group: str = "") -> None:
        self._running[task_id] = (cost, now, group)

    def finished(self, task_id: str, now: float) -> None:
        if task_id not in self._running:
            return
        cost, since, group = self._running.pop(task_id)
        self._done.append((cost, 1.0))
        self._taken[group][0] += cost.total_s
        self._taken[group][1] += max(0.0, now - since)

    def estimate_s(
        self, left: Iterable[tuple[TrialCost, float, str]], *, elapsed_s: float, now: float
    ) -> float:
        """Seconds left, given the (cost, how many, group) trials not submitted yet."""
        credited = list(self._done)
        remaining = [(self._scaled(cost, group), count) for cost, count, group in left]
        for cost, since, group in self._running.values():
            share = min(1.0, max(0.0, now - since) / cost.total_s) if cost.total_s > 0 else 1.0
            credited.append((cost, share))
            remaining.append((self._scaled(cost, group), 1.0 - share))
        done_s = self._wall(credited)
        left_s = self._wall(remaining)
        if self._prior_s is None:
            self._prior_s = max(PRIOR_WEIGHT * (done_s + left_s), 1e-9)
        pace = (self._prior_s + elapsed_s) / (self._prior_s + done_s)
        return pace * left_s

    def _scaled(self, cost: TrialCost, group: str) -> TrialCost:
        predicted = sum(p for p, _ in self._taken.values())
        if group not in self._taken or predicted <= 0:
            return cost
        overall = sum(t for _, t in self._taken.values()) / predicted
        own_predicted, own_taken = self._taken[group]
        pseudo = PRIOR_TRIALS * cost.total_s
        factor = (pseudo + own_taken / overall) / (pseudo + own_predicted) if overall > 0 else 1.0
        return TrialCost(cost.compile_s * factor, cost.device_s * factor, cost.basis)

    def _wall(self, trials: list[tuple[TrialCost, float]]) -> float:
        return cost_model.wall_s(trials, workers=self.workers, lanes=self.lanes)
