"""A tiny MaxText MoE model (tiny_model.py) with moetune's plug-in against the same model on MaxText's own
grouped GEMM: logits, gradients and the loss after one training step agree, and the GEMMs ran on
moetune (its xla backend here), forward and backward."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("maxtext", reason="MaxText is not installed (pip install 'moetune[maxtext]')")

from moetune.integrations import maxtext as plugin  # noqa: E402
from tests.integrations.maxtext import tiny_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
F32 = 1e-5  # float32 products summed in another order
BF16 = 2e-2


def _check(result, tolerance):
    assert result["logits"] < tolerance and result["grads"] < tolerance, result
    assert result["grad_leaves"] > 0
    assert abs(result["loss_after"][0] - result["loss_after"][1]) < tolerance * 10, result
    assert result["loss_after"][0] < result["loss"][0], "one SGD step lowered the loss"
    ops = {op for op, *_ in result["dispatched"]}
    assert ops == {"grouped_matmul", "grouped_matmul_drhs"}, result["dispatched"]
    assert {backend for *_, backend in result["dispatched"]} == {"xla"}
    assert result["maxtext_dispatched"] == 0  # MaxText's own run never reached moetune


@pytest.mark.slow
def test_megablox_route_forward_and_a_training_step_match_maxtexts_own():
    result = tiny_model.compare({})
    _check(result, F32)
    # gate and up [G, 64, 96] and down [G, 96, 64] over the 64 tokens' 128 rows, padded by MaxText to its
    # 512-row tile: rows past the groups.
    assert ("grouped_matmul", 512, 64, 96, 8, "xla") in result["dispatched"]
    assert ("grouped_matmul", 512, 96, 64, 8, "xla") in result["dispatched"]


@pytest.mark.slow
def test_tokamax_route_matches_maxtexts_megablox_route():
    # MaxText's own tokamax route runs on TPUs and GPUs only: its megablox route is the reference.
    _check(tiny_model.compare({"megablox": False, "use_tokamax_gmm": True}, reference={}), F32)


@pytest.mark.slow
def test_ragged_dot_route_of_maxtexts_gpu_configs_matches_maxtexts_own():
    # megablox: false, as MaxText's GPU model configs set it: its gmm calls jax.lax.ragged_dot.
    _check(tiny_model.compare({"megablox": False}), F32)


@pytest.mark.slow
def test_fused_gate_and_up_weights_are_one_gemm():
    result = tiny_model.compare({"prefuse_moe_weights": True})
    _check(result, F32)
    assert ("grouped_matmul", 512, 64, 192, 8, "xla") in result["dispatched"]


@pytest.mark.slow
def test_bfloat16_model_matches_within_bfloat16_rounding():
    _check(tiny_model.compare({"dtype": "bfloat16", "weight_dtype": "bfloat16"}), BF16)


def test_a_setting_the_plugin_cannot_serve_fails_at_trace_and_runs_nothing():
    config = tiny_model.config(sparse_matmul=False)
    with pytest.raises(plugin.MaxTextConfigUnsupported, match="sparse_matmul=False"):
        tiny_model.run(config, moetune=True)
    assert not plugin.is_installed()


@pytest.mark.slow
def test_expert_parallel_and_check_vma_meshes_on_four_cpu_devices():
    """Four host devices in a process of their own. XLA:CPU has no ragged_all_to_all, so expert
    parallelism runs as MaxText's ring of experts (tokens all-gathered, each shard its 2 of the 8 experts,
    group_sizes of all 8 with the slice's offset); check_vma under FSDP is compared with MaxText's own
    route without it, whose interpreted kernel cannot run under check_vma on a CPU."""
    cases = [
        {"overrides": {"ici_expert_parallelism": 4, "ici_fsdp_parallelism": 1, "use_ring_of_experts": True}},
        {
            "overrides": {"ici_fsdp_parallelism": 4, "check_vma": True},
            "reference": {"ici_fsdp_parallelism": 4, "check_vma": False},
        },
    ]
    script = Path(tiny_model.__file__)
    done = subprocess.run(
        [sys.executable, str(script), "4", json.dumps(cases)],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    ring, vma = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    _check(ring, F32)
    assert {g for *_, g, _ in ring["dispatched"]} == {2}, ring["dispatched"]  # 8 experts over 4 shards
    _check(vma, F32)
