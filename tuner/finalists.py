"""Promotion: the sweep's best few are re-timed side by side with the current winner, and a challenger
replaces the winner only when it is faster by more than the noise of that measurement.

Single medians from different moments are not comparable to 1%: clocks, temperature and neighbours
drift. Interleaved re-timing (A B C, B C A, ...) exposes every finalist to the same drift, and the
spread of its own samples says how large a difference is real. Example: winner 1.00 ms, challenger
0.985 ms, spreads 0.4% and 0.6%: the gain of 1.5% is below the default minimum of 2%, so the winner stays.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from moetune.tuner.durations import ms


@dataclasses.dataclass(frozen=True)
class Finalist:
    trial_id: int
    config: dict[str, Any]
    median_s: float  # from the sweep's own timing
    is_winner: bool = False


@dataclasses.dataclass(frozen=True)
class Decision:
    promote: Finalist | None
    reason: str
    medians_s: tuple[float | None, ...] = ()  # re-timed median per finalist


def choose(candidates: Sequence[Finalist], winner: Finalist | None, count: int) -> list[Finalist]:
    """The `count` fastest candidates, plus the current winner when it is not among them."""
    chosen = sorted(candidates, key=lambda f: f.median_s)[:count]
    if winner is not None:
        chosen = [f for f in chosen if f.config != winner.config] + [winner]
    return chosen


def spread(samples: Sequence[float]) -> float:
    """Relative inter-quartile range: the noise of one finalist's re-timing."""
    if len(samples) < 4:
        return 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4)
    return (q3 - q1) / statistics.median(samples)


def decide(finalists: Sequence[Finalist], samples: Sequence[Sequence[float]], min_gain: float) -> Decision:
    """Whether the fastest re-timed challenger replaces the winner (or becomes the first one)."""
    medians = tuple(statistics.median(s) if s else None for s in samples)
    timed = [(m, f, s) for m, f, s in zip(medians, finalists, samples, strict=True) if m is not None]
    winner = next(((m, f, s) for m, f, s in timed if f.is_winner), None)
    challengers = [item for item in timed if not item[1].is_winner]
    if not challengers:
        return Decision(None, "no challenger survived re-timing", medians)
    best_median, best, best_samples = min(challengers, key=lambda item: item[0])
    if winner is None:
        if any(f.is_winner for f in finalists):
            return Decision(best, "the current winner failed re-timing", medians)
        return Decision(best, f"first winner: {ms(best_median)} ms (re-timed interleaved)", medians)
    winner_median, _, winner_samples = winner
    gain = (winner_median - best_median) / winner_median
    noise = max(spread(best_samples), spread(winner_samples))
    needed = max(min_gain, noise)
    compared = (
        f"{ms(best_median)} ms vs {ms(winner_median)} ms for the winner: {gain:+.1%}, needed {needed:.1%}"
    )
    if gain > needed:
        return Decision(best, f"beats the winner by more than the noise: {compared}", medians)
    return Decision(None, f"winner kept: {compared}", medians)
