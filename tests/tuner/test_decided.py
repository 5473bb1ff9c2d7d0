"""A winner as decided: the stored decision, and comparisons that never mix single and re-timed medians."""

from __future__ import annotations

import json

import pytest

from moetune.tuner import decided
from moetune.tuner.decided import RECORDED, RETIMED, SWEEP, WinnerView
from moetune.tuner.finalists import RULES, Finalist, decide

HEURISTIC = {"tile": 1}
# By single medians the heuristic (1.00 ms) is ahead of tile 2 (1.05 ms); re-timed side by side, tile 2
# takes 0.90 ms and the heuristic 1.20 ms.
A = Finalist(11, HEURISTIC, 1.00e-3)
B = Finalist(12, {"tile": 2}, 1.05e-3)
W = Finalist(9, {"tile": 9}, 1.10e-3, is_winner=True)


def flat(value: float, n: int = 20) -> list[float]:
    return [value] * n


def test_the_record_holds_every_finalists_re_timed_median_the_rule_and_the_gain():
    decision = decide([A, B, W], [flat(1.2e-3), flat(0.9e-3), flat(1.0e-3)], min_gain=0.02)
    record = decided.record(decision, sweep_id=7, rounds=5, heuristic=HEURISTIC)
    json.dumps(record, allow_nan=False)  # plain JSON: the winners table stores it as it is
    assert (record["rule"], record["sweep_id"], record["rounds"], record["promoted_trial_id"]) == (
        "beats_winner",
        7,
        5,
        12,
    )
    assert record["rule"] in RULES and record["gain"] == pytest.approx(0.1) and record["needed"] == 0.02
    by_trial = {f["trial_id"]: f for f in record["finalists"]}
    assert by_trial[12]["retimed_median_s"] == 0.9e-3 and by_trial[12]["sweep_median_s"] == 1.05e-3
    assert by_trial[11]["heuristic"] and not by_trial[12]["heuristic"]
    assert by_trial[9]["incumbent"] and by_trial[9]["samples"] == 20


def test_no_record_without_a_re_timing():
    from moetune.tuner.finalists import Decision

    assert (
        decided.record(Decision(None, "winner kept: no challenger"), sweep_id=1, rounds=5, heuristic=None)
        is None
    )


def test_the_winner_shows_the_re_timed_median_and_beats_the_heuristic_it_beat():
    record = decided.record(
        decide([A, B], [flat(1.2e-3), flat(0.9e-3)], 0.02), sweep_id=7, rounds=5, heuristic=HEURISTIC
    )
    view = WinnerView.of(12, {"tile": 2}, 1.05e-3, [record])
    assert (view.time.seconds, view.time.source) == (0.9e-3, RETIMED)
    versus = view.versus(HEURISTIC, 1.00e-3)  # the heuristic's sweep median is faster...
    assert (versus.time.seconds, versus.basis) == (1.2e-3, RETIMED)  # ...but it lost the re-timing
    assert versus.ratio == pytest.approx(1.2 / 0.9) and versus.ratio > 1


def test_a_config_that_was_not_re_timed_is_compared_on_sweep_medians_of_both():
    record = decided.record(decide([B], [flat(0.9e-3)], 0.02), sweep_id=7, rounds=5, heuristic=HEURISTIC)
    view = WinnerView.of(12, {"tile": 2}, 1.05e-3, [record])
    versus = view.versus(None, 5.25e-3)  # XLA's baseline: never one of this backend's finalists
    assert (versus.time.source, versus.basis) == (SWEEP, SWEEP)
    assert versus.ratio == pytest.approx(5.25e-3 / 1.05e-3)  # against the winner's sweep median, not 0.9
    assert view.versus(HEURISTIC, None) is None  # nothing to compare


def test_a_winner_without_a_decision_shows_its_recorded_median_labelled_so():
    view = WinnerView.of(12, {"tile": 2}, 1.05e-3, [None])
    assert (view.time.seconds, view.time.source, view.decision) == (1.05e-3, RECORDED, None)
    assert view.versus(HEURISTIC, 1.0e-3).ratio == pytest.approx(1.0 / 1.05)
    assert "no decision kept" in decided.describe(None)


def test_the_first_decision_that_re_timed_the_winner_is_the_one_shown():
    older = decided.record(decide([B], [flat(0.8e-3)], 0.02), sweep_id=3, rounds=5, heuristic=None)
    without = decided.record(decide([A], [flat(1.0e-3)], 0.02), sweep_id=7, rounds=5, heuristic=None)
    view = WinnerView.of(12, {"tile": 2}, 1.05e-3, [without, older])  # this sweep's did not re-time it
    assert view.decision["sweep_id"] == 3 and view.time.seconds == 0.8e-3
    assert decided.describe(view.decision) == "first winner (sweep 3, 5 interleaved rounds)"
