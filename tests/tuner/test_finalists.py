"""Promotion decisions: a challenger replaces the winner only beyond the minimum gain and the noise."""

from __future__ import annotations

from moetune.tuner.finalists import Finalist, choose, decide, spread

A = Finalist(1, {"tile": 1}, 1.00e-3)
B = Finalist(2, {"tile": 2}, 1.10e-3)
C = Finalist(3, {"tile": 3}, 1.20e-3)
W = Finalist(9, {"tile": 9}, 1.05e-3, is_winner=True)


def steady(value: float, n: int = 20) -> list[float]:
    return [value * (1 + 0.001 * (i % 3 - 1)) for i in range(n)]


def test_choose_takes_the_fastest_and_adds_the_winner():
    assert choose([C, A, B], None, 2) == [A, B]
    assert choose([C, A, B], W, 2) == [A, B, W]
    assert choose([A, Finalist(9, {"tile": 9}, 0.9e-3)], W, 3) == [A, W]  # the winner appears once


def test_first_winner_is_the_fastest_re_timed_finalist():
    # Re-timing reverses the sweep's order: the interleaved numbers decide.
    decision = decide([A, B], [steady(1.2e-3), steady(1.1e-3)], min_gain=0.02)
    assert decision.promote == B
    assert "first winner" in decision.reason


def test_challenger_within_min_gain_keeps_the_winner():
    decision = decide([A, W], [steady(0.99e-3), steady(1.0e-3)], min_gain=0.02)
    assert decision.promote is None
    assert decision.reason.startswith("winner kept")


def test_challenger_beyond_min_gain_replaces_the_winner():
    decision = decide([A, W], [steady(0.9e-3), steady(1.0e-3)], min_gain=0.02)
    assert decision.promote == A
    assert "+10.0%" in decision.reason


def test_noise_larger_than_min_gain_raises_the_bar():
    noisy = [1.0e-3 * f for f in (0.8, 1.2, 0.85, 1.15, 0.9, 1.1, 1.0, 1.0)]
    assert spread(noisy) > 0.1
    decision = decide([A, W], [steady(0.93e-3), noisy], min_gain=0.02)
    assert decision.promote is None  # 7% faster, but the winner's own samples vary by more than that


def test_failed_finalists_are_ignored_and_a_failed_winner_is_replaced():
    assert decide([A, B], [[], steady(1e-3)], 0.02).promote == B
    assert decide([A, W], [steady(1e-3), []], 0.02).promote == A
    assert decide([A], [[]], 0.02).promote is None
