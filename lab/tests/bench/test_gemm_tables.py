"""lab/bench/moe_shapes.py and lab/bench/gemm_table.py on synthetic bench_gemm cases: the shapes and
routings every GEMM benchmark uses, the three ratios, and the table."""

from __future__ import annotations

import json
import sys

import pytest
from tests.bench.synthetic import MOSAIC_CONFIG

from moetune.kernels.problem import Problem
from moetune.tuner.plan import parse_problem
from moetune.tuner.spec import load_sweep_file
from moetune_lab.bench import gemm_table, moe_shapes

CONFIG = MOSAIC_CONFIG | {"block_m": 128}


def test_a_shape_is_mixtrals_gemm_at_t_tokens():
    shape = moe_shapes.Shape("down", 1024)
    assert (shape.m, shape.k, shape.n, shape.name) == (2048, 14336, 4096, "down_T1024")
    assert shape.flops == 2 * 2048 * 14336 * 4096


@pytest.mark.parametrize("tokens", [1, 3, 16, 1024])
def test_routings_give_every_row_to_an_expert_and_at_most_t_rows_to_one(tokens):
    shape = moe_shapes.Shape("gate_up", tokens)
    for routing in moe_shapes.ROUTINGS:
        sizes = moe_shapes.group_sizes(shape, routing)
        assert len(sizes) == moe_shapes.EXPERTS and sum(sizes) == shape.m
        assert max(sizes) <= tokens  # top-2 sends a token to two different experts
    balanced = moe_shapes.group_sizes(shape, "balanced")
    assert max(balanced) - min(balanced) <= 1
    zipf = moe_shapes.group_sizes(moe_shapes.Shape("gate_up", 1024), "zipf")
    assert zipf == sorted(zipf, reverse=True) and zipf[0] > 2 * zipf[-1]
    with pytest.raises(ValueError, match="routing='uniform' is not one of"):
        moe_shapes.group_sizes(shape, "uniform")


def case(moetune=0.5, torch=0.6, mgpu_best=0.55, cublas=0.45, roofline=0.4, **extra) -> dict:
    methods = {
        "moetune": {"median_ms": moetune, "config": CONFIG},
        "torch_grouped_mm": {"median_ms": torch},
        "mgpu_best": {"median_ms": mgpu_best},
        "cublas_torch": {"median_ms": cublas},
    }
    return {
        "proj": "gate_up",
        "tokens": 512,
        "routing": "balanced",
        "hbm_roofline_ms": roofline,
        "methods": methods,
    } | extra


def test_the_three_ratios_are_against_the_better_peer_cublas_and_the_roofline():
    ratios = moe_shapes.target_ratios(case())
    assert ratios == pytest.approx({"vs_peer": 0.55 / 0.5, "vs_cublas": 0.9, "vs_roofline": 0.8})
    missing = case()
    del missing["methods"]["torch_grouped_mm"], missing["methods"]["mgpu_best"]
    assert moe_shapes.target_ratios(missing)["vs_peer"] is None


@pytest.mark.parametrize(
    ("changes", "label"),
    [
        ({}, "128x128k64s4 ws-n"),
        ({"warp_specialized": False, "persistent": False, "split_k": 4}, "128x128k64s4 plain np sk4"),
        ({"grid_minor_dim": "expert", "grid_tile_width": 8}, "128x128k64s4 ws-n expert8"),
        ({"grid_minor_dim": "m", "grid_tile_width": 1}, "128x128k64s4 ws-n m1"),
    ],
)
def test_a_config_label_names_what_differs_from_the_common_case(changes, label):
    assert gemm_table.config_label(CONFIG | changes) == label


def test_the_winner_is_the_fastest_config_moetune_tried_and_says_if_it_was_the_packs():
    moetune = {
        "config": CONFIG,
        "tried": [
            {"config": CONFIG | {"split_k": 2}, "median_ms": 0.6, "from_pack": True},
            {"config": CONFIG, "median_ms": 0.5},
        ],
    }
    assert gemm_table.winner_of(moetune) == (CONFIG, False)
    moetune["tried"][0]["median_ms"] = 0.4
    config, from_pack = gemm_table.winner_of(moetune)
    assert config["split_k"] == 2 and from_pack
    assert gemm_table.winner_label(config, from_pack) == "128x128k64s4 ws-n sk2 (pack)"
    assert gemm_table.winner_of({"config": CONFIG}) == (CONFIG, False)


def test_the_table_orders_rows_by_projection_then_t_then_routing_as_the_runs_first_give_them():
    cases = [
        case(tokens=4096, routing="zipf"),
        case(proj="down", tokens=16),
        case(tokens=4096),
        case(tokens=16, winner="given label"),
    ]
    lines = gemm_table.rows(cases)
    assert lines[0] == gemm_table.HEADER and lines[1].count("---") == 15
    keys = [line.split(" | ")[:3] for line in lines[2:]]
    assert keys == [
        ["| gate_up", "16", "balanced"],
        ["| gate_up", "4096", "zipf"],
        ["| gate_up", "4096", "balanced"],
        ["| down", "16", "balanced"],
    ]
    assert lines[2] == (
        "| gate_up | 16 | balanced | 0.500 | 0.600 | 0.550 | - | - | - | 0.450 | 0.400 | 1.100x | 90% "
        "| 80.0% | given label |"
    )
    assert lines[3].endswith("| 128x128k64s4 ws-n |")


def test_the_script_prints_the_table_of_its_files(tmp_path, monkeypatch, capsys):
    runs = [tmp_path / "a.json", tmp_path / "b.json"]
    runs[0].write_text(json.dumps({"cases": [case(tokens=64)]}))
    runs[1].write_text(json.dumps({"cases": [case(proj="down", tokens=1)]}))
    monkeypatch.setattr(sys, "argv", ["gemm_table.py", *map(str, runs)])
    assert gemm_table.main() == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and lines[2].startswith("| gate_up | 64 |") and lines[3].startswith("| down | 1 |")


def test_the_bench_sweep_tunes_exactly_the_plain_gate_up_shapes_bench_gemm_times():
    """configs/sweeps/mixtral-8x7b-bench.yaml: the model sweep tunes gate_up with SwiGLU fused, bench_gemm
    times it unfused; this sweep gives every bench_gemm gate_up row a tuned winner to start from."""
    spec, _ = load_sweep_file("mixtral-8x7b-bench")
    tuned = {parse_problem(text).problem for text in spec.problems}
    shapes = [moe_shapes.Shape("gate_up", tokens) for tokens in moe_shapes.TOKENS]
    assert tuned == {Problem("grouped_matmul", m=s.m, k=s.k, n=s.n, g=moe_shapes.EXPERTS) for s in shapes}
