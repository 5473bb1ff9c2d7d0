"""Promotion: the sweep's best few are re-timed side by side with the current winner, and a challenger
replaces the winner only when it is faster by more than the noise of that measurement.

Single medians from different moments are not comparable to 1%: clocks, temperature and neighbours
drift. Interleaved re-timing (A B C, B C A, ...) exposes every finalist to the same drift, and the
spread of its own samples says how large a difference is real. Example: winner 1.00 ms, challenger
0.985 ms, spreads 0.4% and 0.6%: the gain of 1.5% is below the default minimum of 2%, so the winner stays.
"""

from __future__ import annotations

import dataclasses
import functools
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


# The rule that decided, by name (a winner's stored decision names it): what each one means.
RULES = {
    "first_winner": "no winner yet: the fastest re-timed finalist becomes the first",
    "beats_winner": "the fastest challenger is faster than the winner by more than max(min gain, noise)",
    "winner_kept": "no challenger is faster than the winner by more than max(min gain, noise)",
    "winner_failed": "the winner failed re-timing: the fastest re-timed challenger replaces it",
    "none_survived": "no challenger survived re-timing: nothing changes",
}


@dataclasses.dataclass(frozen=True)
class Decision:
    promote: Finalist | None
    reason: str
    medians_s: tuple[float | None, ...] = ()  # re-timed median per finalist
    rule: str = ""  # a key of RULES; "" when no re-timing decided (nothing to re-time, or it failed)
    finalists: tuple[Finalist, ...] = ()  # the re-timed ones, in the order of medians_s
    samples: tuple[int, ...] = ()  # re-timed samples per finalist
    gain: float | None = None  # (winner - fastest challenger) / winner, re-timed; with a winner only
    needed: float | None = None  # the gain the rule asked for: max(min gain, the noise of both)


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
    made = functools.partial(
        Decision, medians_s=medians, finalists=tuple(finalists), samples=tuple(len(s) for s in samples)
    )
    timed = [(m, f, s) for m, f, s in zip(medians, finalists, samples, strict=True) if m is not None]
    winner = next(((m, f, s) for m, f, s in timed if f.is_winner), None)
    challengers = [item for item in timed if not item[1].is_winner]
    if not challengers:
        return made(None, "no challenger survived re-timing", rule="none_survived")
    best_median, best, best_samples = min(challengers, key=lambda item: item[0])
    if winner is None:
        if any(f.is_winner for f in finalists):
            return made(best, "the current winner failed re-timing", rule="winner_failed")
        return made(best, f"first winner: {ms(best_median)} ms (re-timed interleaved)", rule="first_winner")
    winner_median, _, winner_samples = winner
    gain = (winner_median - best_median) / winner_median
    noise = max(spread(best_samples), spread(winner_samples))
    needed = max(min_gain, noise)
    compared = (
        f"{ms(best_median)} ms vs {ms(winner_median)} ms for the winner: {gain:+.1%}, needed {needed:.1%}"
    )
    if gain > needed:
        reason = f"beats the winner by more than the noise: {compared}"
        return made(best, reason, rule="beats_winner", gain=gain, needed=needed)
    return made(None, f"winner kept: {compared}", rule="winner_kept", gain=gain, needed=needed)
