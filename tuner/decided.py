"""A winner as it was decided: the stored decision (how a promotion went) and the times shown beside it.

A sweep ranks candidates by one median each, taken moments apart; promotion re-times the finalists
interleaved (tuner/finalists.py) and decides on those medians. So a winner is shown with the re-timed
median that decided it, and each comparison uses numbers of one kind: re-timed against re-timed where
the other config (the heuristic default, XLA's ragged_dot) was a finalist or the incumbent, else the
sweep's single medians of both, said to be such. Example: winner 0.0489 ms and heuristic 0.0396 ms as
single medians, but re-timed side by side 0.0368 ms and 0.0410 ms: the winner shows 0.0368 ms, the
heuristic 0.0410 ms (re-timed), 1.11x.

The stored decision is plain JSON (the winners table's `decision` column):

    {"schema": 1, "sweep_id": 7, "rule": "beats_winner", "reason": "...", "rounds": 5,
     "gain": 0.1, "needed": 0.02, "promoted_trial_id": 12,
     "finalists": [{"trial_id": 12, "config": {...}, "retimed_median_s": 3.68e-05, "samples": 20,
                    "sweep_median_s": 4.89e-05, "incumbent": false, "heuristic": false}, ...]}

A winner without one (promoted before decisions were kept, or imported from a pack) shows its recorded
median, labelled so.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

from moetune.tuner.durations import Unit
from moetune.tuner.finalists import RULES, Decision
from moetune.tuner.tasks import canonical

SCHEMA = 1
# Where a time shown comes from.
RETIMED = "retimed"  # the interleaved re-timing that decided the winner
SWEEP = "sweep"  # the trial's single median from its sweep
RECORDED = "recorded"  # a winner's median with no decision kept (older winners, config packs)


def record(
    decision: Decision, *, sweep_id: int | None, rounds: int, heuristic: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The decision as stored with the winner; None when no re-timing decided it."""
    if not decision.rule:
        return None
    heuristic_key = canonical(heuristic) if heuristic is not None else None
    finalists = [
        {
            "trial_id": f.trial_id,
            "config": dict(f.config),
            "retimed_median_s": median,
            "samples": samples,
            "sweep_median_s": f.median_s if math.isfinite(f.median_s) else None,
            "incumbent": f.is_winner,
            "heuristic": canonical(f.config) == heuristic_key,
        }
        for f, median, samples in zip(decision.finalists, decision.medians_s, decision.samples, strict=True)
    ]
    return {
        "schema": SCHEMA,
        "sweep_id": sweep_id,
        "rule": decision.rule,
        "reason": decision.reason,
        "rounds": rounds,
        "gain": decision.gain,
        "needed": decision.needed,
        "promoted_trial_id": decision.promote.trial_id if decision.promote else None,
        "finalists": finalists,
    }


@dataclasses.dataclass(frozen=True)
class Timed:
    seconds: float | None
    source: str  # RETIMED, SWEEP or RECORDED

    def to_dict(self) -> dict[str, Any]:
        return {"median_s": self.seconds, "source": self.source}


@dataclasses.dataclass(frozen=True)
class Compared:
    """Another config's time beside the winner's; `ratio` = its time / the winner's (> 1: the winner is
    faster), both times of one kind, `basis`."""

    time: Timed
    ratio: float | None
    basis: str  # RETIMED or SWEEP (a winner without a decision: its recorded median stands for it)

    def to_dict(self) -> dict[str, Any]:
        return {
            "median_s": self.time.seconds,
            "source": self.time.source,
            "ratio": self.ratio,
            "basis": self.basis,
        }

    def cell(self, unit: Unit) -> str:
        """'0.041 re-timed' or '0.052 sweep': which kind of number it is, and so what its ratio compares."""
        return f"{unit.format(self.time.seconds)} {'re-timed' if self.time.source == RETIMED else 'sweep'}"

    def ratio_cell(self) -> str:
        return "-" if self.ratio is None else f"{self.ratio:.2f}x"


def _ratio(slow: float | None, fast: float | None) -> float | None:
    return slow / fast if slow and fast else None


@dataclasses.dataclass(frozen=True)
class WinnerView:
    """A winner's shown time and its comparisons. `sweep_s` is its trial's own median."""

    trial_id: int
    config: dict[str, Any]
    sweep_s: float | None
    decision: dict[str, Any] | None  # the one whose re-timing included this winner, if any

    @classmethod
    def of(
        cls,
        trial_id: int,
        config: dict[str, Any],
        sweep_s: float | None,
        decisions: Iterable[dict[str, Any] | None],
    ) -> WinnerView:
        """`decisions` in order of preference (this sweep's, then the stored one): the first that
        re-timed this winner is the one shown."""
        for decision in decisions:
            if decision and _retimed(decision, trial_id=trial_id, config=config) is not None:
                return cls(trial_id, dict(config), sweep_s, decision)
        return cls(trial_id, dict(config), sweep_s, None)

    @property
    def time(self) -> Timed:
        if self.decision is None:
            return Timed(self.sweep_s, RECORDED)
        return Timed(_retimed(self.decision, trial_id=self.trial_id, config=self.config), RETIMED)

    def versus(self, config: dict[str, Any] | None, sweep_s: float | None) -> Compared | None:
        """Another config (None: not a config of this backend, e.g. XLA's baseline on another backend)
        whose sweep median is `sweep_s`; None when there is nothing to compare."""
        retimed = _retimed(self.decision, config=config) if self.decision and config is not None else None
        if retimed is not None:
            return Compared(Timed(retimed, RETIMED), _ratio(retimed, self.time.seconds), RETIMED)
        if sweep_s is None:
            return None
        return Compared(Timed(sweep_s, SWEEP), _ratio(sweep_s, self.sweep_s), SWEEP)

    def cell(self, unit: Unit) -> str:
        """The decided time; a recorded one says so."""
        time = self.time
        return unit.format(time.seconds) + (" recorded" if time.source == RECORDED else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "trial_id": self.trial_id,
            "config": self.config,
            **self.time.to_dict(),
            "sweep_median_s": self.sweep_s,
        }


def _retimed(
    decision: dict[str, Any] | None, *, trial_id: int | None = None, config: Any = None
) -> float | None:
    """The re-timed median of the finalist with that trial id or that config (None: not re-timed)."""
    if not decision:
        return None
    key = canonical(config) if config is not None else None
    for f in decision.get("finalists") or []:
        same_trial = trial_id is not None and f.get("trial_id") == trial_id
        if same_trial or (key is not None and canonical(f.get("config") or {}) == key):
            return f.get("retimed_median_s")
    return None


def describe(decision: dict[str, Any] | None) -> str:
    """One line: which rule decided, in which sweep, on how many rounds."""
    if not decision:
        return "no decision kept: the recorded median"
    rule = decision.get("rule", "")
    where = f"sweep {decision.get('sweep_id')}, " if decision.get("sweep_id") is not None else ""
    gain = ""
    if decision.get("gain") is not None and decision.get("needed") is not None:
        gain = f", gain {decision['gain']:+.1%} (needed {decision['needed']:.1%})"
    rounds = decision.get("rounds")
    return f"{rule.replace('_', ' ')} ({where}{rounds} interleaved rounds{gain})" if rule in RULES else rule
