"""lab/bench/leave_one_out.py on synthetic measurements: the model's own estimates at a known value of a
constant per shape stand in for the timings, so each refit without one shape is known in advance."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from moetune.kernels.backends.mosaic_gpu import calibration, space
from moetune.kernels.problem import GROUPED_MATMUL, GROUPED_MATMUL_SWIGLU, Problem
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


# --- Across shapes -----------------------------------------------------------------------------------

MIXTRAL_DOWN = Problem(GROUPED_MATMUL, m=256, k=14336, n=4096, g=8)
MIXTRAL_GATE_UP = Problem(GROUPED_MATMUL_SWIGLU, m=256, k=4096, n=28672, g=8)
DEEPSEEK_EP8_DOWN = Problem(GROUPED_MATMUL, m=8192, k=2048, n=7168, g=32)
QWEN_DOWN = Problem(GROUPED_MATMUL, m=1024, k=768, n=2048, g=128)
# On a grid point of PLAIN_MMA_EFFICIENCY's fit (0.85 / 2**0.5 and 0.85 / 2), so that a fit can land on it.
PLAIN_TRUTH = 0.85 / 2**0.5
PLAIN_OTHER_TRUTH = 0.85 / 2


def test_a_models_gate_up_down_and_input_gradient_share_a_group_and_other_experts_do_not():
    input_gradient = Problem(GROUPED_MATMUL, m=256, k=28672, n=4096, g=8)  # reads gate_up's two halves
    fp8_down = Problem(
        "grouped_matmul_fp8", m=256, k=14336, n=4096, g=8, lhs_dtype="float8_e4m3fn",
        rhs_dtype="float8_e4m3fn", transpose_rhs=True, scale_layout="row_channel",
    )  # fmt: skip
    other_experts = Problem(GROUPED_MATMUL, m=256, k=14336, n=4096, g=16)
    other_model = Problem(GROUPED_MATMUL, m=256, k=2048, n=4096, g=8)
    labels = loo.model_groups(
        [MIXTRAL_GATE_UP, MIXTRAL_DOWN, input_gradient, fp8_down, other_experts, other_model]
    )
    mixtral = "g=8,dims=4096/14336"
    assert (
        labels[MIXTRAL_GATE_UP]
        == labels[MIXTRAL_DOWN]
        == labels[input_gradient]
        == labels[fp8_down]
        == mixtral
    )
    assert labels[other_experts] == "g=16,dims=4096/14336"
    assert labels[other_model] == "g=8,dims=2048/4096"
    # Alone, a gate_up is labelled by its FFN width, not by its rhs's 2F columns.
    assert loo.model_groups([MIXTRAL_GATE_UP]) == {MIXTRAL_GATE_UP: mixtral}


def test_the_shipped_baselines_group_by_model_and_leave_the_weight_gradient_out():
    timed = loo.timed_configs(json.loads(loo.BASELINES.read_text()))
    forward = [t.problem for t in timed if loo.forward_kernel(t.problem)]
    assert 0 < len(forward) < len(timed)  # the weight gradient's rows are left out
    labels = loo.model_groups(forward)
    assert all(label.startswith(f"g={p.g},") for p, label in labels.items())
    assert {label for p, label in labels.items() if p.g == 8} == {"g=8,dims=4096/14336"}


def _best_of_each_tile(problem: Problem) -> list[dict]:
    """The ranking's best config of each (tile, pipeline kind, grid kind): plain and warp-specialized."""
    space.ranking.cache_clear()
    best: dict[tuple, dict] = {}
    for config, _ in space.ranking(problem, loo.H200):
        kind = (config.block_m, config.block_n, config.wg_split, config.warp_specialized, config.persistent)
        best.setdefault(kind, config.to_dict())
    space.ranking.cache_clear()
    return list(best.values())


def _timed_at(problem: Problem, plain_efficiency: float) -> list[loo.Timed]:
    """Configs of `problem` 'measured' at the model's own estimate under that PLAIN_MMA_EFFICIENCY."""
    configs = _best_of_each_tile(problem)
    held = {k: c["value"] for k, c in calibration.load().constants.items()}
    truth = loo.Estimates(
        [loo.Timed(problem, c, 1.0) for c in configs], dict(held, PLAIN_MMA_EFFICIENCY=plain_efficiency)
    )
    return [
        loo.Timed(problem, c, float(s)) for c, s in zip(configs, np.exp(truth.log_seconds({})), strict=True)
    ]


def _estimates(timed: list[loo.Timed]) -> loo.Estimates:
    return loo.Estimates(timed, {k: c["value"] for k, c in calibration.load().constants.items()})


def test_the_fit_recovers_the_efficiency_the_measurements_were_made_with_and_orders_every_pair():
    estimates = _estimates(_timed_at(DEEPSEEK_EP8_DOWN, PLAIN_TRUTH) + _timed_at(MIXTRAL_DOWN, PLAIN_TRUTH))
    everything = np.ones(len(estimates.timed), dtype=bool)
    shipped = loo.scores(estimates, {}, everything)
    assert shipped.ordered < shipped.pairs  # the shipped 0.85 orders some pairs wrong
    fitted = loo.fit(loo.ACROSS, estimates, everything)
    assert fitted["PLAIN_MMA_EFFICIENCY"] == pytest.approx(PLAIN_TRUTH, rel=1e-9)
    # The constants the measurements did not move stay where they were.
    assert {k: v for k, v in fitted.items() if k != "PLAIN_MMA_EFFICIENCY"} == {
        k: estimates.shipped[k] for k in loo.ACROSS if k != "PLAIN_MMA_EFFICIENCY"
    }
    refit = loo.scores(estimates, fitted, everything)
    assert refit.ordered == refit.pairs == shipped.pairs and refit.error_factor == pytest.approx(1.0)


def _baselines(timed: list[loo.Timed]) -> dict:
    entries = []
    for i, t in enumerate(timed):
        dims = {"op": t.problem.op, "m": t.problem.m, "k": t.problem.k, "n": t.problem.n, "g": t.problem.g}
        entries.append(
            {"name": f"row{i}", "unit": "ms", "median": t.seconds * 1e3, "params": dims, "config": t.config}
        )
    return {"entries": entries}


def three_models() -> list[loo.Timed]:
    """Mixtral's shapes measured at one efficiency, DeepSeek-V3 EP=8's and Qwen3's at another."""
    mixtral = _timed_at(MIXTRAL_DOWN, PLAIN_OTHER_TRUTH) + _timed_at(MIXTRAL_GATE_UP, PLAIN_OTHER_TRUTH)
    return mixtral + _timed_at(DEEPSEEK_EP8_DOWN, PLAIN_TRUTH) + _timed_at(QWEN_DOWN, PLAIN_TRUTH)


def test_each_group_is_refitted_without_its_own_shapes_and_scored_on_them():
    timed = three_models()
    across = loo.across_groups(calibration.load(), _baselines(timed), names=("PLAIN_MMA_EFFICIENCY",))
    labels = loo.model_groups([t.problem for t in timed])
    assert [h.group for h in across.held_out] == [
        "g=128,dims=768/2048",
        "g=32,dims=2048/7168",
        "g=8,dims=4096/14336",
    ]
    for held in across.held_out:
        others = [t for t in timed if labels[t.problem] != held.group]
        assert held.trained_on == tuple(sorted({labels[t.problem] for t in others}))
        assert {p.shape for p in held.picks} == {
            t.problem.key for t in timed if labels[t.problem] == held.group
        }
        # The refit is the fit to the other groups' configs alone.
        alone = loo.fit(("PLAIN_MMA_EFFICIENCY",), _estimates(others), np.ones(len(others), dtype=bool))
        assert held.refit == alone
    # Held out, Mixtral (measured at another efficiency) gets the others' value, which orders it worse.
    mixtral = across.held_out[2]
    assert mixtral.refit["PLAIN_MMA_EFFICIENCY"] == pytest.approx(PLAIN_TRUTH, rel=1e-9)
    assert mixtral.refitted.ordered < mixtral.refitted.pairs
    assert "Summary over held-out groups" in loo.across_report(across)


def test_the_across_fit_is_deterministic():
    baselines = _baselines(
        _timed_at(DEEPSEEK_EP8_DOWN, PLAIN_TRUTH) + _timed_at(QWEN_DOWN, PLAIN_OTHER_TRUTH)
    )
    names = ("EPILOGUE_S", "PLAIN_MMA_EFFICIENCY")
    first, second = (loo.across_groups(calibration.load(), baselines, names=names) for _ in range(2))
    assert first == second and loo.across_report(first) == loo.across_report(second)


def test_a_pick_follows_the_constants_not_the_spaces_cached_ranking():
    problem = Problem(GROUPED_MATMUL, m=32768, k=2048, n=7168, g=32)
    shipped = loo.pick(problem, {})
    # Without the M split's handicap its 64x256 CTA wins; the shipped ranking is not reused for it.
    assert loo.pick(problem, {"M_SPLIT_MMA_EFFICIENCY": 1.0})["wg_split"] == "m" != shipped["wg_split"]
    assert loo.pick(problem, {}) == shipped


def test_the_command_writes_both_leave_one_outs(tmp_path, capsys):
    baselines = tmp_path / "baselines.json"
    baselines.write_text(json.dumps(_baselines(_timed_at(QWEN_DOWN, PLAIN_TRUTH))))
    out = tmp_path / "out.json"
    assert loo.main(["--baselines", str(baselines), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "WALK_S_PER_GROUP without" in printed and "Fitted on every group" in printed
    payload = json.loads(out.read_text())
    assert len(payload["rows"]) == 8 and [h["group"] for h in payload["across"]["held_out"]] == [
        "g=128,dims=768/2048"
    ]
