"""The model benchmark end to end on the tiny config: the measurement and its command line."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.lookup import LOOKUP
from moetune_lab.model import cli
from moetune_lab.model.bench import SCHEMA, run_model_bench
from moetune_lab.model.config import model_config

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def no_database():
    with LOOKUP.using_db(None):
        yield


def _positive(value) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


def test_bench_model_writes_its_result_as_json(tmp_path, monkeypatch):
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)  # the CLI sets it; undone after
    out = tmp_path / "results" / "model.json"
    result = run_model_bench("tiny", 1, 8, 2, ["dense", "moetune"], 1, out, moe_tokens=(16,), runs=1)
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(result))
    assert written["schema"] == SCHEMA and written["complete"] and written["ok"]
    assert {"date", "command", "device", "versions"} <= written.keys()
    assert written["device"]["device_kind"] == "cpu" and written["versions"]["jax"]
    assert written["model"]["layers"] == 1 and written["model"]["hidden"] == 64
    # The layer is timed at the requested count and at the model's prefill (1 x 8) and decode (1) counts.
    assert written["moe_tokens"] == [16, 8, 1]
    for path in ("dense", "moetune"):
        entry = written["results"][path]
        for phase, tokens in (("prefill", 8), ("decode", 2)):
            stats = entry[phase]
            assert len(stats["samples_s"]) == 1 and _positive(stats["compile_s"])
            assert stats["tokens_per_s"] == pytest.approx(tokens / stats["median_s"])
        assert [m["tokens"] for m in entry["moe"]] == [16, 8, 1]
        assert all(_positive(m["median_s"]) for m in entry["moe"])
        # The decode step's bytes over the read bandwidth measured in the run, and the path's share of it.
        roofline = written["read_GBps"] * 1e9 / model_config("tiny", 1).decode_step_bytes(1, 8 + 2 // 2)
        assert entry["decode"]["roofline_tokens_per_s"] == pytest.approx(roofline)
        assert entry["decode"]["roofline_share"] == pytest.approx(entry["decode"]["tokens_per_s"] / roofline)
        # Each timed block's rows per expert: T * top_k rows (the tiny model's top_k is 2) in every block.
        for m in entry["moe"]:
            assert len(m["rows_per_expert"]) == m["reps"]
            assert all(sum(rows) == 2 * m["tokens"] and min(rows) >= 0 for rows in m["rows_per_expert"])
    # Both paths route the first block's input identically.
    first = [written["results"][p]["moe"][0]["rows_per_expert"][0] for p in ("dense", "moetune")]
    assert first[0] == first[1]
    parity = written["parity"]["moetune"]
    assert parity["ok"] and parity["logits"]["rel_l2"] < parity["logits"]["tolerance"]
    assert set(parity["moe_layer"]) == {"16", "8", "1"}
    assert set(written["moe_layer_speedup"]["moetune_vs_dense"]) == {"16", "8", "1"}
    # decode_block "auto" is moe_mlp's, which keeps the unfused path on a CPU.
    block = written["results"]["moetune"]["moe_block"]["decode"]
    assert block["form"] == "unfused" and block["decode_block"] == "auto"
    assert {m["moe_block"] for m in written["results"]["moetune"]["moe"]} == {"unfused"}
    # What grouped_matmul picked for each GEMM of the moetune path: gate_up and down per token count.
    dispatch = written["moetune_dispatch"]
    assert len(dispatch) == 6 and {d["backend"] for d in dispatch} == {"xla"}


def test_a_decode_step_reads_every_weight_but_the_embedding_and_the_untouched_experts():
    tiny = model_config("tiny")  # H 64, F 96, 2 layers, 4 heads and 2 KV heads of 16, 8 experts top-2, V 256
    attention = 64 * (4 + 2 * 2) * 16 + 4 * 16 * 64
    expert, router, kv = 3 * 64 * 96, 64 * 8, 2 * 2 * 16 * 10
    one_token = 2 * (2 * (attention + 2 * expert + router + kv) + 64 * 256)
    assert tiny.decode_step_bytes(1, 10) == one_token
    # A batch of 8 routes to all 8 experts at most, and reads 8 KV caches.
    batch = 2 * (2 * (attention + 8 * expert + router + 8 * kv) + 64 * 256)
    assert tiny.decode_step_bytes(8, 10) == tiny.decode_step_bytes(16, 10) - 2 * 2 * 8 * kv == batch


def test_bad_arguments_fail_before_any_work():
    with pytest.raises(ConfigInvalid, match="unknown MoE path 'fused'"):
        run_model_bench("tiny", 1, 8, 2, ["fused"])
    with pytest.raises(ConfigInvalid, match="batch=0 must be a positive integer"):
        run_model_bench("tiny", 0, 8, 2)
    with pytest.raises(ConfigInvalid, match="experts_scale_layout='per_row' is not one of none, tensor"):
        run_model_bench("tiny", 1, 8, 2, fp8="per_row")
    # The tiny model's hidden 64 is no whole 128-block.
    with pytest.raises(ConfigInvalid, match="needs hidden and intermediate multiples of 128; got 64, 96"):
        run_model_bench("tiny", 1, 8, 2, fp8="block_1x128_128x128")


def test_the_fp8_model_runs_after_the_others_on_its_quantized_experts_and_stays_close(tmp_path):
    result = run_model_bench("tiny", 1, 8, 2, ["dense"], 1, moe_tokens=(16,), runs=1, fp8="row_channel")
    assert result["ok"] and result["paths"] == ["dense", "moetune_fp8"]
    entry = result["results"]["moetune_fp8"]
    # One layer of the tiny model: 8 experts x 3 x 64 x 96 weights, one byte each.
    assert entry["experts_GB"] == pytest.approx(8 * 3 * 64 * 96 / 1e9)
    fp8 = dataclasses.replace(model_config("tiny", 1), experts_scale_layout="row_channel")
    roofline = result["read_GBps"] * 1e9 / fp8.decode_step_bytes(1, 8 + 2 // 2)
    assert entry["decode"]["roofline_tokens_per_s"] == pytest.approx(roofline)
    parity = result["parity"]["moetune_fp8"]
    # Quantization shows (the 16-bit paths agree to 1e-2), within the FP8 bounds.
    assert 1e-2 < parity["logits"]["rel_l2"] < parity["logits"]["tolerance"] == 0.15
    assert all(1e-2 < c["rel_l2"] < c["tolerance"] == 0.1 for c in parity["moe_layer"].values())


def test_fp8_experts_are_k_major_quantized_from_the_same_draw_and_only_moetune_runs_them():
    import jax.numpy as jnp

    from moetune.kernels.moe import fp8 as moe_fp8
    from moetune_lab.model import mixtral
    from moetune_lab.model.weights import init_params

    bf16 = model_config("tiny", 1)
    fp8 = dataclasses.replace(bf16, experts_scale_layout="tensor")
    dense, quantized = init_params(bf16).layers[0], init_params(fp8).layers[0]
    assert quantized.w_gate_up.dtype == jnp.float8_e4m3fn and quantized.w_gate_up.shape == (8, 192, 64)
    assert quantized.w_down.shape == (8, 64, 96) and quantized.w_down_scale.shape == (8, 1, 1)
    expected, _ = moe_fp8.quantize_weights(dense.w_gate_up, "tensor", transpose=True)
    assert (quantized.w_gate_up.astype(jnp.float32) == expected.astype(jnp.float32)).all()
    h = jnp.ones((4, 64), jnp.bfloat16)
    with pytest.raises(ConfigInvalid, match="FP8 experts run on the moetune path only, not 'ragged'"):
        mixtral.routed_experts(fp8, quantized, h, jnp.zeros((4, 8)), "ragged", "xla")


def _bench(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_command_fails_with_exit_2_and_names_the_bad_input(capsys):
    code, output = _bench(["--model", "mixtral_9x9b"], capsys)
    assert code == 2
    known = "mixtral_8x7b, qwen3_30b_a3b, qwen3_next_80b_a3b, tiny, tiny_qwen3, tiny_qwen3_next"
    assert f"error: unknown model 'mixtral_9x9b'; known: {known}" in output
    code, output = _bench(["--model", "tiny", "--moe-tokens", "4096,x"], capsys)
    assert code == 2 and "'4096,x' must be comma-separated integers" in output
    code, output = _bench(["--model", "tiny", "--decode-attention-tiling", "splits=3"], capsys)
    assert code == 2 and "error: decode attention tiling: splits=3 must be a power of two" in output
    code, output = _bench(["--model", "tiny", "--gemv", "fast"], capsys)
    assert code == 2 and "invalid choice: 'fast'" in output


def test_each_kernel_choice_is_a_flag_with_its_choices(capsys):
    code, output = _bench(["--help"], capsys)
    assert code == 0
    text = " ".join(output.split())
    flags = ("--routing", "--norm-router", "--norm-route-gather", "--gemv", "--decode-attention")
    for flag in (*flags, "--decode-block"):
        assert f"{flag} {{auto,kernel,xla,interpret}}" in text, flag
    assert "--decode-residual {accumulate,add}" in text


def test_the_qwen3_shaped_model_benches_with_the_kernel_choices_of_its_flags(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    out = tmp_path / "qwen3.json"
    argv = ["--model", "tiny_qwen3", "--layers", "1", "--prompt", "8", "--gen", "2"]
    argv += ["--paths", "dense,moetune", "--moe-tokens", "16", "--runs", "1", "--out", str(out)]
    argv += ["--gemv", "interpret", "--decode-attention", "xla", "--decode-attention-tiling", "splits=16"]
    code, output = _bench(argv, capsys)
    assert code == 0, output
    written = json.loads(out.read_text())
    assert written["model"]["name"] == "tiny_qwen3" and written["model"]["qk_norm"]
    assert written["ok"] and written["parity"]["moetune"]["ok"]
    kernels = written["pallas_kernels"]
    assert (kernels["gemv"], kernels["decode_attention"], kernels["routing"]) == ("interpret", "xla", "xla")
    assert kernels["decode_attention_tiling"] == "block_k=64,splits=16,num_warps=4,num_stages=2"
    # 8 rows per token over the 32 experts in every timed block.
    for m in written["results"]["moetune"]["moe"]:
        assert all(sum(rows) == 8 * m["tokens"] and len(rows) == 32 for rows in m["rows_per_expert"])


def test_gpu_script_runs_with_only_jax_numpy_and_moetune(tmp_path):
    # The GPU machine has no Ray, Optuna, SQLAlchemy (nor, maybe, Typer): the script must not need them,
    # neither at import nor while tracing the moetune path with --no-db.
    out = tmp_path / "model.json"
    argv = ["--model", "tiny", "--layers", "1", "--batch", "1", "--prompt", "4", "--gen", "2"]
    argv += ["--paths", "moetune", "--moe-tokens", "4", "--runs", "1", "--no-db", "--out", str(out)]
    forbidden = ["ray", "optuna", "sqlalchemy", "alembic", "typer", "rich", "moetune.db", "moetune.cli"]
    probe = (
        "import runpy, sys\n"
        f"sys.argv = ['bench_model.py', *{argv!r}]\n"
        "try:\n"
        f"    runpy.run_path({str(REPO / 'lab' / 'model' / 'cli.py')!r}, run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    print('exit', e.code)\n"
        f"print('loaded', sorted(m for m in {forbidden!r} if m in sys.modules))\n"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert "exit 0" in run.stdout, run.stdout + run.stderr
    assert "loaded []" in run.stdout, run.stdout
    assert json.loads(out.read_text())["results"]["moetune"]["decode"]["tokens_per_s"] > 0
