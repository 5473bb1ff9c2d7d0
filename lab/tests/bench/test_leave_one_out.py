"""lab/bench/leave_one_out.py on synthetic measurements: the model's own estimates at a known value of a
constant per shape stand in for the timings, so each refit without one shape is known in advance."""

from __future__ import annotations

import dataclasses

import pytest

from moetune.kernels.backends.mosaic_gpu import calibration
from moetune.kernels.problem import GROUPED_MATMUL, Problem
from moetune_lab.bench import leave_one_out as loo

TABLE = {
    "block_k": 128, "block_m": 128, "block_n": 128, "epi_tile_m": 64, "epi_tile_n": 64,
    "grid_minor_dim": "expert", "grid_tile_width": 8, "max_concurrent_steps": 2, "pad_lhs": False,
    "persistent": True, "split_k": 1, "tile_schedule": "table", "warp_specialized": True, "wg_split": "n",
}  # fmt: skip
WALK = dict(TABLE, tile_schedule="walk")
# Three down GEMMs at 1024 tokens, each "measured" at its own walk cost per group.
TRUTH = {
    Problem(GROUPED_MATMUL, m=8192, k=2048, n=7168, g=32): 140e-9,
    Problem(GROUPED_MATMUL, m=8192, k=768, n=2048, g=128): 150e-9,
    Problem(GROUPED_MATMUL, m=2048, k=14336, n=4096, g=8): 160e-9,
}


def _problem_dict(problem: Problem) -> dict:
    return {f.name: getattr(problem, f.name) for f in dataclasses.fields(problem)}


def synthetic() -> tuple[calibration.Calibration, dict]:
    cal = calibration.load()
    held = {k: c["value"] for k, c in cal.constants.items()}
    measurements, pairs, entries = {}, [], []
    for i, (problem, walk_s) in enumerate(TRUTH.items()):
        values = dict(held, WALK_S_PER_GROUP=walk_s)
        sides = {}
        for label, config in (("walk", WALK), ("table", TABLE)):
            median = loo.estimate(_problem_dict(problem), config, values) * 1e3
            sides[label] = {
                "problem": _problem_dict(problem),
                "config": config,
                "samples": [median] * 5,
                "median": median,
            }
        measurements[f"m{i}"] = {"unit": "ms", "sides": sides}
        pairs.append({"measurement": f"m{i}", "slower": "walk", "faster": "table"})
        # The baselines time the full fit's pick on each shape.
        pick = loo.pick(problem, dict(held, WALK_S_PER_GROUP=150e-9))
        dims = {"op": problem.op, "m": problem.m, "k": problem.k, "n": problem.n, "g": problem.g}
        entries.append({"name": f"row{i}", "unit": "ms", "median": 0.5 + i, "params": dims, "config": pick})
    constants = {k: dict(v) for k, v in cal.constants.items()}
    constants["WALK_S_PER_GROUP"] = dict(
        constants["WALK_S_PER_GROUP"],
        evidence={"fit": "difference", "pairs": pairs, "bracket": [0.0, 2e-6], "tolerance": 1.3},
    )
    for name in constants:
        if name != "WALK_S_PER_GROUP":
            constants[name]["evidence"] = None
    synthetic_cal = dataclasses.replace(cal, constants=constants, measurements=measurements)
    return synthetic_cal, {"entries": entries}


def test_each_shape_left_out_refits_from_the_others_and_is_ranked_with_that_refit():
    cal, baselines = synthetic()
    rows, single = loo.leave_one_out(cal, baselines)
    assert single == []
    assert [r.constant for r in rows] == ["WALK_S_PER_GROUP"] * 3
    # The full fit is the median of the three shapes' values; without one, the median of the other two.
    assert all(r.full_fit == pytest.approx(150e-9, rel=1e-3) for r in rows)
    expected = {140e-9: 155e-9, 150e-9: 150e-9, 160e-9: 145e-9}
    for row, walk_s in zip(rows, TRUTH.values(), strict=True):
        assert row.refit == pytest.approx(expected[walk_s], rel=1e-3)
        # The full fit's pick is the one the baselines timed; the refit's is timed where it is the same.
        assert row.full_pick_s is not None
        assert (row.pick_s == row.full_pick_s) if row.same_pick else row.pick_s is None
    text = loo.report(rows, single)
    assert text.count("WALK_S_PER_GROUP without grouped_matmul/") == 3


def test_the_shipped_file_refits_the_walk_per_shape_and_names_the_constants_fitted_to_one():
    rows, single = loo.leave_one_out(calibration.load(), {"entries": []})
    # The walk's cost per group is fitted across eight DeepSeek-V3 EP=8 shapes: one refit without each.
    assert {r.constant for r in rows} == {"WALK_S_PER_GROUP"} and len(rows) == 8
    assert "WALK_S_PER_GROUP" not in single and {"PROMOTE_OPS", "STEP_WAIT_S"} <= set(single)
    assert "nothing is left to refit" in loo.report(rows, single)
