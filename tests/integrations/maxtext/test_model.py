"""A tiny MaxText MoE model (tiny_model.py) with moetune's plug-in against the same model on MaxText's own
grouped GEMM: logits, gradients and the loss after one training step agree, and the GEMMs ran on
moetune (its xla backend here), forward and backward."""

from __future__ import annotations

import pytest

from tests.requires import require

require("maxtext", extra="maxtext")

from moetune.integrations import maxtext as plugin  # noqa: E402
from tests.integrations.maxtext import tiny_model  # noqa: E402

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


@pytest.fixture(scope="module")
def maxtexts_own():
    """The float32 tiny model on MaxText's own megablox kernel (its default route), run once: every route
    computes the same function of the same weights, so each is checked against this."""
    return tiny_model.run(tiny_model.config(), moetune=False)


def _against(maxtexts_own, **overrides):
    return tiny_model.differences(tiny_model.run(tiny_model.config(**overrides), moetune=True), maxtexts_own)


@pytest.mark.slow
def test_megablox_route_forward_and_a_training_step_match_maxtexts_own(maxtexts_own):
    result = _against(maxtexts_own)
    _check(result, F32)
    # gate and up [G, 64, 96] and down [G, 96, 64] over the 64 tokens' 128 rows, padded by MaxText to its
    # 512-row tile: rows past the groups.
    assert ("grouped_matmul", 512, 64, 96, 8, "xla") in result["dispatched"]
    assert ("grouped_matmul", 512, 96, 64, 8, "xla") in result["dispatched"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "route",
    [
        {"megablox": False},  # jax.lax.ragged_dot, as MaxText's GPU model configs set it
        {"megablox": False, "use_tokamax_gmm": True},  # MaxText's own runs on TPUs and GPUs only
    ],
    ids=["ragged_dot", "tokamax"],
)
def test_the_other_routes_match_maxtexts_own(maxtexts_own, route):
    _check(_against(maxtexts_own, **route), F32)


@pytest.mark.slow
def test_fused_gate_and_up_weights_are_one_gemm():
    # Its own weights (one [G, emb, 2 x ffn] tensor), so its own reference: MaxText's ragged_dot route.
    result = tiny_model.compare(
        {"prefuse_moe_weights": True}, {"prefuse_moe_weights": True, "megablox": False}
    )
    _check(result, F32)
    assert ("grouped_matmul", 512, 64, 192, 8, "xla") in result["dispatched"]


@pytest.mark.slow
def test_bfloat16_model_matches_within_bfloat16_rounding():
    bf16 = {"dtype": "bfloat16", "weight_dtype": "bfloat16"}
    _check(tiny_model.compare(bf16, bf16 | {"megablox": False}), BF16)  # MaxText's ragged_dot route


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
    ring, vma = tiny_model.on_host_devices(4, cases)
    _check(ring, F32)
    assert {g for *_, g, _ in ring["dispatched"]} == {2}, ring["dispatched"]  # 8 experts over 4 shards
    _check(vma, F32)
