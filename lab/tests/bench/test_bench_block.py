"""lab/bench/bench_block.py's parts that run without a GPU: moetune's block cut at its stages computes
moe_mlp's output, a case's record holds every method (the ones that cannot run here as error records),
and the rules that skip XLA and compare times."""

from __future__ import annotations

import numpy as np
import pytest

from moetune.kernels.moe.layer import moe_mlp
from moetune_lab.bench import bench_block, dev_shapes

TINY = dev_shapes.Model("tiny", experts=8, top_k=2, hidden=64, ffn=32)
TOKENS = 16


@pytest.fixture(scope="module")
def block_args():
    return bench_block.block_inputs(bench_block.parameters(TINY, TOKENS), TOKENS)


def fake_timer(fn, args, runs):
    """Runs the compiled function as time_jax would and reports a fixed time (CUPTI needs a GPU)."""
    fn(*args)
    return [1e-3] * runs


def test_the_stages_compose_to_moe_mlp(block_args):
    inputs, out = bench_block.stage_inputs(bench_block.stage_fns(TINY), *block_args)
    assert list(inputs) == list(bench_block.STAGES)
    whole = moe_mlp(*block_args, top_k=TINY.top_k)
    assert out.shape == whole.shape == (TOKENS, TINY.hidden) and out.dtype == whole.dtype
    np.testing.assert_allclose(
        np.asarray(out, np.float32), np.asarray(whole, np.float32), rtol=2e-2, atol=2e-2
    )
    assert np.abs(np.asarray(whole, np.float32)).max() > 0.1  # not a vacuous comparison of zeros


def fake_counter(fn, args):
    return [("route", 0.25), ("gemm", 0.75)]  # CUPTI needs a GPU


def test_a_case_records_every_method_and_stage():
    params = bench_block.parameters(TINY, 2 * TOKENS)
    record = bench_block.run_case(
        TINY, TOKENS, params, 2, bench_block.METHODS, timer=fake_timer, counter=fake_counter,
        roofline=lambda model, logits: 0.5,
    )  # fmt: skip
    methods = record["methods"]
    assert list(methods) == list(bench_block.METHODS)
    assert methods["moetune"]["median_ms"] == 1.0 and methods["moetune"]["samples_ms"] == [1.0, 1.0]
    assert methods["moetune"]["kernels"] == 2 and methods["moetune"]["roofline_share"] == 0.5
    assert methods["moetune"]["kernel_names"] == ["route", "gemm"]
    assert methods["moetune"]["kernel_ms"] == [0.25, 0.75]
    assert record["roofline_ms"] == 0.5 and methods["moetune_unfused"]["kernels"] == 2
    # The fused block needs a Hopper GPU: here it is a skipped record naming why, and moe_mlp's own
    # choice (decode_mode "auto") is recorded with its reason.
    assert "the fused block does not run" in methods["moetune_fused"]["skipped"]
    assert methods["moetune"]["block"]["fused"] is False and methods["moetune"]["block"]["reason"]
    assert "block" not in methods["moetune_unfused"]
    assert methods["xla"]["rel_err"] < bench_block.PARITY_MAX_REL_ERR
    for peer in ("tokamax", "torch_grouped_mm"):  # absent or GPU-only here: a record, not a crash
        assert "median_ms" in methods[peer] or len(methods[peer]["error"]) <= 300
    assert set(record["stages"]) == set(bench_block.STAGES)
    assert record["stage_sum_ms"] == pytest.approx(5.0)
    assert record["speedup"]["xla"] == 1.0
    assert (record["model"], record["tokens"], record["top_k"], record["experts"]) == ("tiny", TOKENS, 2, 8)
    assert "T=16" in bench_block.case_line(record) and "2 kernels, 50% of roofline" in bench_block.case_line(
        record
    )


def test_the_roofline_counts_the_experts_some_token_touches():
    import jax.numpy as jnp

    logits = jnp.array([[5.0, 4.0, 0.0, 0.0], [5.0, 0.0, 4.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    assert bench_block.touched_experts(logits, 1) == 2  # experts 0 and 3
    assert bench_block.touched_experts(logits, 2) == 4


def test_xla_is_skipped_past_its_expansion():
    qwen3, deepseek = dev_shapes.MODELS["qwen3-30b-a3b"], dev_shapes.MODELS["deepseek-v3"]
    assert bench_block.xla_skip_reason(qwen3, 4096) is None  # 17 GB
    assert "GB" in bench_block.xla_skip_reason(deepseek, 4096)  # 120 GB
    assert bench_block.xla_skip_reason(deepseek, 128) is None
    assert bench_block.xla_expansion_bytes(TINY, TOKENS) == TOKENS * 2 * 8 * 64 * 2


def test_ratios_name_the_faster_peer_and_need_moetune():
    got = bench_block.ratios({"moetune": 2.0, "tokamax": 3.0, "torch_grouped_mm": 2.6, "xla": 18.0})
    assert got["speedup"] == {"tokamax": 1.5, "torch_grouped_mm": 1.3, "xla": 9.0}
    assert got["peer_vs_moetune"] == 1.3
    assert "peer_vs_moetune" not in bench_block.ratios({"moetune": 1.0, "xla": 2.0})
    assert bench_block.ratios({"tokamax": 1.0}) == {}


def test_a_record_sums_the_stages_only_when_all_ran():
    stages = {s: {"median_ms": 1.0} for s in bench_block.STAGES}
    methods = {"moetune": {"median_ms": 4.0}, "xla": {"skipped": "too big"}, "tokamax": {"error": "E: x"}}
    record = bench_block.case_record(TINY, 1, methods, stages)
    assert record["stage_sum_ms"] == 5.0 and record["speedup"] == {}
    stages["down"] = {"error": "RuntimeError: no kernel ran"}
    assert "stage_sum_ms" not in bench_block.case_record(TINY, 1, methods, stages)


def test_an_error_record_names_the_type_and_stays_short():
    assert bench_block.error_record(ValueError("bad")) == {"error": "ValueError: bad"}
    assert len(bench_block.error_record(RuntimeError("x" * 1000))["error"]) == 300


def test_kernel_profile_matches_each_kernel_by_name_when_calls_record_them_in_another_order(monkeypatch):
    from jax.experimental.mosaic.gpu import profiler

    calls = iter(
        [
            [("route", 1.0), ("gemm", 10.0), ("combine", 2.0), ("gemm", 5.0)],
            [("gemm", 12.0), ("route", 3.0), ("gemm", 6.0), ("combine", 4.0)],
            [("route", 2.0), ("gemm", 11.0), ("gemm", 7.0), ("combine", 3.0)],
        ]
    )
    monkeypatch.setattr(profiler, "measure", lambda fn, aggregate: lambda *args: (None, next(calls)))
    profile = bench_block.kernel_profile(lambda: None, (), calls=3)
    assert profile == [("route", 2.0), ("gemm", 11.0), ("combine", 3.0), ("gemm", 6.0)]
