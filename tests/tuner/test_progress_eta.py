"""The live ETA against a scripted clock: a sweep of mixed small and large problems whose trials take
longer (large) and shorter (small) than the cost model predicts."""

from __future__ import annotations

import pytest

from moetune.tuner.cost_model import TrialCost
from moetune.tuner.driver import SweepDriver
from moetune.tuner.eta import Eta
from moetune.tuner.executors import InlineExecutor
from moetune.tuner.plan import parse_problem
from moetune.tuner.progress import summary_line
from moetune.tuner.spec import SweepSpec
from tests.tuner import sim_backend
from tests.tuner.sim_sweeps import DEVICE, RecordingProgress

SMALL = TrialCost(compile_s=0.5, device_s=0.01, basis="prior")
LARGE = TrialCost(compile_s=2.0, device_s=6.0, basis="prior")
STEP_S = 0.5  # how often the display asks (scripted seconds)


def serial_sweep(trials: list[tuple[TrialCost, float]]) -> tuple[list[tuple[float, float]], float]:
    """(elapsed, ETA) readings every STEP_S of a sweep running `trials` (cost, true seconds) one by one
    on one worker, and its true length."""
    eta = Eta(workers=1, lanes=1)
    now, readings = 0.0, []
    for i, (cost, true_s) in enumerate(trials):
        eta.started(str(i), cost, now, group=str(cost))
        end = now + true_s
        while now < end:
            left = [(c, 1.0, str(c)) for c, _ in trials[i + 1 :]]
            readings.append((now, eta.estimate_s(left, elapsed_s=now, now=now)))
            now = min(end, now + STEP_S)
        eta.finished(str(i), now)
    return readings, now


@pytest.mark.parametrize("large_factor, small_factor", [(1.8, 0.6), (0.6, 1.8), (1.9, 1.9), (0.55, 0.55)])
def test_eta_starts_within_2x_of_the_truth_moves_smoothly_and_converges(large_factor, small_factor):
    # Largest first, as the driver schedules them.
    trials = [(LARGE, LARGE.total_s * large_factor)] * 8 + [(SMALL, SMALL.total_s * small_factor)] * 24
    readings, total_s = serial_sweep(trials)
    first_elapsed, first_eta = readings[0]
    assert first_elapsed == 0.0 and total_s / 2 <= first_eta <= 2 * total_s
    finishes = [elapsed + eta for elapsed, eta in readings]
    # The predicted finish moves with each reading's evidence: a trial ending 40% early moves it less
    # than a fifth (the naive rate ETA went from "?" to 46:24 and fell from there).
    for before, after in zip(finishes, finishes[1:], strict=False):
        assert abs(after - before) <= 0.2 * before
    for elapsed, eta in readings:
        error = abs(elapsed + eta - total_s)
        if elapsed >= total_s / 2:
            assert error <= 0.25 * total_s
        if elapsed >= 0.97 * total_s:
            assert error <= 0.03 * total_s


def test_each_problems_work_left_follows_its_own_pace_once_its_trials_finish():
    # Large trials ran at the model's pace, the small ones at a third of it: the small ones left are not
    # charged the large ones' pace (which the whole sweep's pace mostly is).
    trials = [(LARGE, LARGE.total_s)] * 4 + [(SMALL, SMALL.total_s / 3)] * 24
    readings, total_s = serial_sweep(trials)
    halfway = 4 * LARGE.total_s + 12 * SMALL.total_s / 3  # the first reading of the 13th small trial
    elapsed, eta = next((e, t) for e, t in readings if e >= halfway - 1e-9)
    truth = total_s - elapsed
    assert truth / 1.5 <= eta <= truth * 1.5
    assert eta < 0.6 * 12 * SMALL.total_s  # the model's seconds for the small ones left, at the sweep's pace


def test_the_sweeps_eta_is_there_from_its_first_snapshot_and_ends_at_zero(store, sim):
    planned = [
        parse_problem("m=8,k=64,n=64,g=4,dtype=bf16"),
        parse_problem("m=4096,k=512,n=512,g=4,dtype=bf16"),
    ]
    spec = SweepSpec(backend="sim", strategy="grid", baseline=False)
    sweep_id = store.create_sweep(backend="sim", strategy="grid", spec={}, host="h", user="u")
    progress = RecordingProgress()
    clock = iter(range(0, 100_000, 1))  # one scripted second per reading
    driver = SweepDriver(
        store,
        InlineExecutor(sim_backend.simulate, DEVICE),
        spec,
        backend="sim",
        progress=progress,
        clock=lambda: next(clock),
        poll_s=0,
    )
    driver.run(planned, sweep_id=sweep_id)
    first, last = progress.snapshots[0], progress.snapshots[-1]
    assert first.done == 0 and first.eta_s is not None and first.eta_s > 0
    assert "ETA ?" not in summary_line(first)
    assert last.eta_s == 0
