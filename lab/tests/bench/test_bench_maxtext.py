"""lab/bench/bench_maxtext.py without a GPU: on a tiny MaxText MoE model both paths compile, moetune's
dispatches are recorded, outputs are compared before timing, and a path that cannot run is a record."""

from __future__ import annotations

import pytest

pytest.importorskip("maxtext", reason="MaxText is not installed (pip install 'moetune[maxtext]')")

from tests.bench import maxtext_tiny as tiny_model  # noqa: E402

from moetune_lab.bench import bench_maxtext


def fake_timer(fn, args, runs):
    """Runs the executable as the CUPTI timer would and reports fixed times (CUPTI needs a GPU)."""
    fn(*args)
    return [2e-3] * runs


def _argv(**changes):
    return [tiny_model.base_yml(), *(f"{k}={v}" for k, v in (tiny_model.TINY | changes).items())]


@pytest.mark.slow
def test_every_case_compares_both_paths_before_timing_them():
    cases = ("layer", "step")
    payload = bench_maxtext.run(_argv(megablox=False), cases, bench_maxtext.WORKLOADS, 3, fake_timer)
    records = payload["records"]
    assert [r["name"] for r in records] == [
        "layer/decode/forward", "layer/prefill/forward", "layer/train/forward+backward", "step/train"
    ]  # fmt: skip
    for record in records:
        assert "error" not in record, record
        assert record["rel_err"] < 1e-4 and record["dispatched"], record
        assert record["methods"]["moetune"]["samples_ms"] == [2.0, 2.0, 2.0] and record["speedup"] == 1.0
    assert [r["tokens"] for r in records] == [2, 32, 64, 64]  # a batch of 2 x 1, 16, 32, 32 tokens
    assert any("grouped_matmul_drhs" in d for d in records[2]["dispatched"])  # the backward ran on moetune
    assert records[3]["worst_output"].startswith("[1]")  # a gradient of value_and_grad's (loss, grads)
    # decode_mode 'auto' on a CPU: MaxText's path at up to 32 tokens, and the plug-in says why.
    assert [r["decode_block"] for r in records] == [
        ["T=2: MaxText's routed path (not on a GPU)"], ["T=32: MaxText's routed path (not on a GPU)"], [], []
    ]  # fmt: skip


def test_a_decode_layer_runs_as_the_fused_block_where_the_decode_mode_takes_it():
    payload = bench_maxtext.run(
        _argv(megablox=False), ("layer",), ("decode",), 2, fake_timer, decode_mode="interpret"
    )
    [record] = payload["records"]
    assert "error" not in record and record["rel_err"] < 1e-4, record
    assert payload["decode_mode"] == "interpret"
    fused = "T=2: the fused decode block (decode_mode='interpret': the heuristic config)"
    assert record["decode_block"] == [fused]
    assert [d.split("/", 1)[0] for d in record["dispatched"]] == ["moe_decode_block"]  # nothing else ran


def test_a_config_the_plugin_refuses_is_a_record_not_a_crash():
    payload = bench_maxtext.run(_argv(sparse_matmul=False), ("layer",), ("decode",), 2, fake_timer)
    [record] = payload["records"]
    assert "sparse_matmul=False" in record["error"] and not record["methods"]


@pytest.mark.slow
def test_each_path_is_traced_on_its_own(monkeypatch):
    """A plug-in whose kernel computes something else must show up as a parity error: the MaxText path may
    not reuse the trace made with the plug-in installed (jax caches traces by function)."""
    from moetune.integrations.maxtext import hook

    real = hook.grouped_matmul
    monkeypatch.setattr(hook, "grouped_matmul", lambda *a, **k: real(*a, **k) * 1.01)
    payload = bench_maxtext.run(_argv(megablox=False), ("layer",), ("prefill",), 2, fake_timer)
    [record] = payload["records"]
    assert "differs from MaxText's" in record["error"], record
    assert "most in the output" in record["error"]  # a forward has one output: no path to name


@pytest.mark.slow
def test_serving_runs_prefill_and_decode_in_maxtexts_engine_on_each_path():
    payload = bench_maxtext.run(
        _argv(megablox=False, per_device_batch_size=1), ("serve",), (), 2, decode_steps=3
    )
    assert (
        payload["route"] == "ragged_dot" and payload["layers"] == tiny_model.TINY["base_num_decoder_layers"]
    )
    prefill, decode = payload["records"]
    assert (prefill["name"], prefill["tokens"]) == (
        "serve/prefill",
        tiny_model.TINY["max_prefill_predict_length"],
    )
    assert (decode["name"], decode["tokens"]) == ("serve/decode", 1)  # one slot: batch-1 decode
    for record in (prefill, decode):
        assert "error" not in record, record
        assert record["rel_err"] < 1e-4 and record["dispatched"]
        runs = 2 if record is prefill else 3
        for method in record["methods"].values():
            assert len(method["samples_ms"]) == runs
            assert method["tokens_per_s"] == pytest.approx(record["tokens"] / method["median_ms"] * 1e3)


@pytest.mark.slow
def test_serving_decodes_on_the_fused_block_where_the_decode_mode_takes_it():
    """MaxText's engine with the plug-in's decode_mode 'interpret': its decode steps (1 token) and its
    16-token prefill run as the fused block, and the logits are MaxText's own."""
    payload = bench_maxtext.run(
        _argv(megablox=False, per_device_batch_size=1), ("serve",), (), 2, decode_steps=2,
        decode_mode="interpret",
    )  # fmt: skip
    for record in payload["records"]:
        assert "error" not in record and record["rel_err"] < 1e-4, record
        assert {d.split(":", 1)[1].split("(", 1)[0].strip() for d in record["decode_block"]} == {
            "the fused decode block"
        }, record["decode_block"]
        assert {d.split("/", 1)[0] for d in record["dispatched"]} == {"moe_decode_block"}
        assert any("/m=1," in d for d in record["dispatched"])  # the decode step's one token


@pytest.mark.slow
def test_serving_catches_a_plugin_that_computes_something_else(monkeypatch):
    from moetune.integrations.maxtext import hook

    real = hook.grouped_matmul
    monkeypatch.setattr(hook, "grouped_matmul", lambda *a, **k: real(*a, **k) * 1.01)
    payload = bench_maxtext.run(
        _argv(megablox=False, per_device_batch_size=1), ("serve",), (), 2, decode_steps=2
    )
    for record in payload["records"]:
        assert "differ from MaxText's" in record["error"] and not record["methods"], record
