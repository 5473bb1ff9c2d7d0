"""The moetune path's MoE blocks on moe_mlp's fused decode block (KernelChoices.decode_block, moe_mlp's
decode_mode), in Pallas's interpreter on a CPU: where the block is chosen it runs instead of the unfused
path and of norm_route_gather, with the same logits; the benchmark's moetune_fused run and its record of
which form ran; the --decode-block flag."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tests.model.test_mixtral import BATCH, PROMPT, STEPS, _prefill_and_decode, _tokens

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.lookup import LOOKUP
from moetune.kernels.moe import decode_block
from moetune_lab.model import bench, cli, gemv, mixtral, norm_router
from moetune_lab.model.config import MODELS, model_config
from moetune_lab.model.kernel_choices import KernelChoices
from moetune_lab.model.weights import init_params


@pytest.fixture(autouse=True)
def no_database():
    with LOOKUP.using_db(None):
        yield


@pytest.fixture
def recorded(monkeypatch):
    """The calls traced into the fused block and into norm_route_gather, on fresh traces (jax's caches
    cleared around the test, so no earlier trace skips them)."""
    calls: dict[str, list[int]] = {"block": [], "gather": []}
    block, gather = decode_block.decode_block, norm_router.norm_route_gather

    def record_block(x, *args, **kwargs):
        calls["block"].append(x.shape[0])
        return block(x, *args, **kwargs)

    def record_gather(x, *args, **kwargs):
        calls["gather"].append(x.shape[0])
        return gather(x, *args, **kwargs)

    monkeypatch.setattr(decode_block, "decode_block", record_block)
    monkeypatch.setattr(norm_router, "norm_route_gather", record_gather)
    jax.clear_caches()
    yield calls
    jax.clear_caches()


def _decode(config, params, choices):
    """Logits [1 + STEPS, B, V] of prefill and each decode step (test_mixtral's), float32 matmuls."""
    tokens = _tokens(config, PROMPT + STEPS, seed=9)
    with jax.default_matmul_precision("float32"):
        return _prefill_and_decode(config, params, tokens, "moetune", choices)


def _layer_shapes(config):
    """Layer 0's weights as shapes and dtypes only: no weights made."""
    return jax.eval_shape(lambda: init_params(config, 0)).layers[0]


def test_the_presets_run_the_block_where_asked_fp8_experts_included():
    next_80b = MODELS["qwen3_next_80b_a3b"]
    assert (next_80b.hidden, next_80b.intermediate, next_80b.experts, next_80b.top_k) == (2048, 512, 512, 10)
    assert (next_80b.heads, next_80b.kv_heads, next_80b.head_dim, next_80b.layers) == (16, 2, 256, 48)
    assert (next_80b.shared_experts, next_80b.shared_intermediate, next_80b.qk_norm) == (1, 512, True)
    mode = "interpret"
    for name in ("qwen3_next_80b_a3b", "qwen3_30b_a3b", "mixtral_8x7b", "tiny_qwen3_next"):
        config = model_config(name, layers=1)
        layer = _layer_shapes(config)
        choice = mixtral.moe_decode_choice(config, layer, 1, "moetune", mode)
        assert choice.config is not None and choice.reason.startswith("decode_mode='interpret'"), name
        # Past the block's 32 tokens, and on the paths without a block: unfused.
        past = mixtral.moe_decode_choice(config, layer, 33, "moetune", mode)
        assert past.config is None and "T=33" in past.reason
        ragged = mixtral.moe_decode_choice(config, layer, 1, "ragged", mode)
        assert ragged.config is None and ragged.reason == "the ragged path has no fused decode block"
        # "auto" is moe_mlp's: on a CPU, the unfused path.
        auto = mixtral.moe_decode_choice(config, layer, 1, "moetune", "auto")
        assert auto.config is None and auto.reason == "not on a GPU"
    # FP8 experts take the block where it is asked for; "auto" resolves their block as the 16-bit one's (on
    # a CPU, the unfused path).
    fp8 = dataclasses.replace(model_config("tiny_qwen3_next", 1), experts_scale_layout="row_channel")
    choice = mixtral.moe_decode_choice(fp8, _layer_shapes(fp8), 1, "moetune", mode)
    assert choice.config is not None and choice.reason.startswith("decode_mode='interpret'")
    auto = mixtral.moe_decode_choice(fp8, _layer_shapes(fp8), 1, "moetune", "auto")
    assert auto.config is None and auto.reason == "not on a GPU"


def test_the_fused_choice_runs_the_block_and_decodes_as_the_unfused_path(recorded):
    config = dataclasses.replace(model_config("tiny_qwen3_next"), dtype="float32")
    params = init_params(config, seed=0)
    unfused = _decode(config, params, KernelChoices(decode_block="xla"))
    assert recorded["block"] == []
    fused = _decode(config, params, KernelChoices(decode_block="interpret"))
    # One trace of the shared MoE function per token count: the prefill's rows, a decode step's.
    assert sorted(set(recorded["block"])) == [BATCH, BATCH * PROMPT]
    np.testing.assert_allclose(fused, unfused, rtol=1e-4, atol=1e-4)


def test_the_fused_block_reads_the_float32_residual_stream_in_norm_route_gathers_place(recorded, monkeypatch):
    """Few experts (norm_route_gather's size): with every decode kernel on, the unfused decode step routes
    and gathers in norm_route_gather; the fused one leaves it out and its block routes, both on the float32
    residual stream that wo's GEMV adds into, with the same logits."""
    config = dataclasses.replace(
        model_config("tiny_qwen3_next"), dtype="float32", experts=8, top_k=2, layers=1
    )
    q, kv = config.heads * config.head_dim, config.kv_heads * config.head_dim
    small = gemv.Tiling(block_n=64, block_k=16, split_k=2)
    monkeypatch.setattr(gemv, "TILINGS", {(config.hidden, q + 2 * kv): small, (q, config.hidden): small})
    streams = []
    accumulate = gemv.accumulate
    record = lambda *a, **kw: streams.append(a[2].dtype) or accumulate(*a, **kw)  # noqa: E731
    monkeypatch.setattr(gemv, "accumulate", record)
    params = init_params(config, seed=2)
    kernels = KernelChoices(
        gemv="interpret", decode_attention="interpret", norm_route_gather="interpret", norm_router="interpret"
    )
    unfused = _decode(config, params, dataclasses.replace(kernels, decode_block="xla"))
    assert recorded["gather"] == [BATCH] and recorded["block"] == []
    recorded["gather"].clear()
    fused = _decode(config, params, dataclasses.replace(kernels, decode_block="interpret"))
    assert recorded["gather"] == [] and BATCH in recorded["block"]
    assert set(streams) == {jnp.dtype(jnp.float32)} and len(streams) >= 2  # carried in both
    np.testing.assert_allclose(fused, unfused, rtol=1e-4, atol=1e-4)


def test_one_run_times_the_unfused_and_fused_paths_and_records_which_ran(tmp_path, monkeypatch):
    """moetune and moetune_fused without the dense path (each fused run then held to its unfused one), then
    the FP8 model's two runs; a prompt of one token and one timed token count, to keep it short."""
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    monkeypatch.setattr(bench, "layer_reps", lambda tokens: 2)
    out = tmp_path / "m.json"
    paths = ["moetune", "moetune_fused"]
    result = bench.run_model_bench(
        "tiny_qwen3_next", 1, 1, 2, paths, 1, out, moe_tokens=(1,), runs=1, fp8="row_channel"
    )
    assert result["ok"], bench.summary_lines(result)
    assert result["paths"] == ["moetune", "moetune_fused", "moetune_fp8", "moetune_fp8_fused"]
    assert json.loads(out.read_text())["paths"] == result["paths"]
    assert result["pallas_kernels"]["decode_block"] == "auto"
    runs = result["results"]
    forms = {name: runs[name]["moe_block"]["decode"] for name in result["paths"]}
    fused = forms["moetune_fused"]
    assert (fused["tokens"], fused["decode_block"], fused["form"]) == (1, "interpret", "fused")
    assert fused["reason"].startswith("decode_mode='interpret'")
    assert forms["moetune"]["form"] == "unfused" and forms["moetune"]["reason"] == "not on a GPU"
    assert forms["moetune_fp8"]["form"] == "unfused" and forms["moetune_fp8"]["decode_block"] == "auto"
    fp8 = forms["moetune_fp8_fused"]
    assert fp8["decode_block"] == "interpret" and fp8["form"] == "fused"
    assert [m["moe_block"] for m in runs["moetune_fused"]["moe"]] == ["fused"]
    assert [m["moe_block"] for m in runs["moetune_fp8_fused"]["moe"]] == ["fused"]
    parity = result["parity"]
    assert set(parity) == {"moetune_fused_vs_moetune", "moetune_fp8_fused_vs_moetune_fp8"}
    check = parity["moetune_fused_vs_moetune"]
    assert check["ok"] and check["logits"]["reference"] == "moetune" and set(check["moe_layer"]) == {"1"}
    assert parity["moetune_fp8_fused_vs_moetune_fp8"]["ok"]
    assert set(result["decode_speedup"]) == {"moetune_fused_vs_moetune", "moetune_fp8_fused_vs_moetune_fp8"}
    lines = "\n".join(bench.summary_lines(result))
    assert "decode MoE block moetune_fused: fused (decode_block=interpret: decode_mode='interpret'" in lines
    assert "parity moetune_fused_vs_moetune: ok vs moetune: logits rel_l2=" in lines


def test_the_decode_block_flag_reaches_the_choices_and_a_bad_value_is_one_line(capsys, monkeypatch):
    given = {}

    def fake_bench(*args, **kwargs):
        given.update(kwargs)
        return {"ok": True}

    monkeypatch.setattr(cli, "run_model_bench", fake_bench)
    monkeypatch.setattr(cli, "summary_lines", lambda result: [])
    assert cli.main(["--model", "tiny", "--decode-block", "interpret"]) == 0
    assert given["choices"] == KernelChoices(decode_block="interpret")
    assert cli.main(["--model", "tiny"]) == 0 and given["choices"].decode_block == "auto"
    capsys.readouterr()
    assert cli.main(["--model", "tiny", "--decode-block", "fast"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "error: decode_block='fast'; expected one of auto, kernel, xla, interpret\n"
    known = "dense, ragged, moetune, moetune_fused"
    with pytest.raises(ConfigInvalid, match=f"unknown MoE path 'fused'; known: {known}"):
        bench.run_model_bench("tiny", 1, 8, 2, ["fused"])
