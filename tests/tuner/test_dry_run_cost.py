"""The per-trial cost model behind `--dry-run` and the live ETA: work-scaled, calibrated from history."""

from __future__ import annotations

import pytest

from moetune.kernels import registry
from moetune.tuner import cost_model
from moetune.tuner.cost_model import CostModel, TrialCost, formula_kernel_s
from moetune.tuner.dry_run import make_plan
from moetune.tuner.plan import parse_problem
from moetune.tuner.spec import SweepSpec
from tests.db import db_factories
from tests.tuner.sim_sweeps import DEVICE

SMALL = parse_problem("m=8,k=64,n=64,g=4,dtype=bf16")
LARGE = parse_problem("m=8192,k=4096,n=4096,g=8,dtype=bf16")
RUNS = 10
PER_CANDIDATE = RUNS + cost_model.EXTRA_DEVICE_RUNS


def record(store, planned, *, compile_s: float, median_s: float, count: int = 4) -> None:
    for tile in range(1, count + 1):
        store.record_trial(
            db_factories.trial(
                config={"tile": tile},
                median_s=median_s,
                compile_s=compile_s,
                device=DEVICE,
                backend="sim",
                problem=planned.problem,
            )
        )


def model(store) -> CostModel:
    return CostModel.from_store(store, registry.get("sim"), DEVICE, RUNS)


def test_the_prior_scales_device_seconds_with_work_and_compile_seconds_with_the_backend(store, sim):
    costs = model(store)
    small, large = costs.cost(SMALL.problem), costs.cost(LARGE.problem)
    assert small.basis == large.basis == "prior" and not costs.measured
    assert small.compile_s == large.compile_s == registry.get("sim").prior_compile_s
    assert large.device_s / small.device_s == pytest.approx(
        formula_kernel_s(LARGE.problem, "gpu") / formula_kernel_s(SMALL.problem, "gpu")
    )
    assert large.device_s > 100 * small.device_s


def test_a_problem_with_trials_of_its_own_is_costed_from_them(store, sim):
    record(store, LARGE, compile_s=3.0, median_s=0.02)
    cost = model(store).cost(LARGE.problem)
    assert cost == TrialCost(3.0, 0.02 * PER_CANDIDATE, "history")


def test_a_problem_without_trials_is_scaled_by_work_from_the_nearest_measured_one(store, sim):
    # The small problem runs 5x slower than the formula says: the large one is assumed to as well.
    slow = 5 * formula_kernel_s(SMALL.problem, "gpu")
    record(store, SMALL, compile_s=1.5, median_s=slow)
    cost = model(store).cost(LARGE.problem)
    assert cost.basis == "nearest" and cost.compile_s == pytest.approx(1.5)
    assert cost.device_s == pytest.approx(5 * formula_kernel_s(LARGE.problem, "gpu") * PER_CANDIDATE)


def test_dry_run_of_a_large_problem_is_not_estimated_from_a_small_problems_trials(store, sim):
    record(store, SMALL, compile_s=0.5, median_s=formula_kernel_s(SMALL.problem, "gpu"))
    spec = SweepSpec(backend="sim", strategy="grid", baseline=False)
    small_plan = make_plan(spec, [SMALL], store, "sim", DEVICE, workers=1)
    plan = make_plan(spec, [LARGE], store, "sim", DEVICE, workers=1)
    row = plan.rows[0]
    assert plan.measured and row.basis == "nearest" and row.to_run == 8
    assert plan.estimate_s == pytest.approx(8 * (row.compile_s + row.device_s))
    work = formula_kernel_s(LARGE.problem, "gpu") / formula_kernel_s(SMALL.problem, "gpu")
    assert row.device_s == pytest.approx(small_plan.rows[0].device_s * work)
    assert plan.estimate_s > small_plan.estimate_s


def test_wall_time_is_the_longer_of_the_workers_and_the_device_lanes():
    cost = TrialCost(compile_s=4.0, device_s=1.0, basis="prior")
    assert cost_model.wall_s([(cost, 8)], workers=4, lanes=1) == 10.0  # 8 x 5 s over 4 workers
    assert cost_model.wall_s([(cost, 8)], workers=40, lanes=1) == 8.0  # the one lane times 8 x 1 s
