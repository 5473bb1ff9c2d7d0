"""benchmarks/bench_maxtext.py without a GPU: on a tiny MaxText MoE model both paths compile, moetune's
dispatches are recorded, outputs are compared before timing, and a path that cannot run is a record."""

from __future__ import annotations

import pytest

pytest.importorskip("maxtext", reason="MaxText is not installed (pip install 'moetune[maxtext]')")

from tests.benchmarks.scripts import load_script  # noqa: E402
from tests.integrations.maxtext import tiny_model  # noqa: E402

bench_maxtext = load_script("bench_maxtext")


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


def test_a_config_the_plugin_refuses_is_a_record_not_a_crash():
    payload = bench_maxtext.run(_argv(sparse_matmul=False), ("layer",), ("decode",), 2, fake_timer)
    [record] = payload["records"]
    assert "sparse_matmul=False" in record["error"] and not record["methods"]
