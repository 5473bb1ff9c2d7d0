"""lab/bench/dev_shapes.py and bench_gemm.py's development-shape ratios, on a CPU: the cases, their
top-k routings, the rotation of routings past the L2, and the target ratios of one record."""

from __future__ import annotations

import pytest

from moetune.kernels.problem import GROUPED_MATMUL, GROUPED_MATMUL_SWIGLU
from moetune_lab.bench import bench_gemm, dev_shapes


def test_cases_run_model_by_model_with_both_gemms():
    cases = dev_shapes.cases(["qwen3-30b-a3b", "deepseek-v3"], (1, 4096))
    assert [c.name for c in cases[:4]] == [
        "qwen3-30b-a3b/gate_up/T1",
        "qwen3-30b-a3b/gate_up/T4096",
        "qwen3-30b-a3b/down/T1",
        "qwen3-30b-a3b/down/T4096",
    ]
    gate_up, down = cases[1].problem, cases[3].problem
    assert (gate_up.op, gate_up.m, gate_up.k, gate_up.n, gate_up.g) == (
        GROUPED_MATMUL_SWIGLU,
        32768,
        2048,
        1536,
        128,
    )
    assert (down.op, down.m, down.k, down.n, down.g) == (GROUPED_MATMUL, 32768, 768, 2048, 128)
    assert gate_up.out_n == down.k


@pytest.mark.parametrize("tokens", [1, 16, 1000])
def test_top_k_routing_gives_each_token_k_distinct_experts(tokens):
    case = dev_shapes.Case(dev_shapes.MODELS["qwen3-next-80b-a3b"], "down", tokens)
    sizes = dev_shapes.top_k_group_sizes(case, seed=3)
    assert len(sizes) == 512 and sum(sizes) == tokens * 10 and max(sizes) <= tokens
    if tokens == 1:
        assert sorted(set(sizes)) == [0, 1]
    assert sizes != dev_shapes.top_k_group_sizes(case, seed=4)


def test_routings_touch_more_than_the_given_bytes_of_weights():
    case = dev_shapes.Case(dev_shapes.MODELS["qwen3-30b-a3b"], "down", 1)
    per_expert = 768 * 2048 * 2
    sets = dev_shapes.routings(case, 120 << 20)
    touched = {i for sizes in sets for i, s in enumerate(sizes) if s}
    assert len(touched) * per_expert >= 120 << 20 and 1 < len(sets) <= 16
    # Every expert already touched: one routing is enough.
    assert len(dev_shapes.routings(dev_shapes.Case(case.model, "down", 4096), 120 << 20)) == 1


def test_dev_ratios():
    record = {
        "hbm_roofline_ms": 0.01,
        "methods": {
            "moetune_heuristic": {"median_ms": 0.022},
            "moetune_alt1": {"median_ms": 0.02},
            "moetune_alt2": {"error": "skipped: budget spent"},
            "torch_grouped_mm": {"median_ms": 0.03},
            "tokamax_mosaic": {"median_ms": 0.025},
            "cublas_torch": {"median_ms": 0.005},
        },
    }
    ratios = bench_gemm.dev_ratios(record)
    assert ratios["best_ms"] == 0.02
    assert ratios["heuristic_vs_best"] == pytest.approx(1.1)
    assert ratios["peer_vs_best"] == pytest.approx(1.25)  # tokamax, the faster peer
    assert ratios["cublas_vs_best"] == pytest.approx(0.25) and ratios["roofline_vs_best"] == pytest.approx(
        0.5
    )
