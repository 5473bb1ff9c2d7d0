"""MaxText's routed MoE at decode sizes through the plug-in: where moe_mlp's decode_choice takes moetune's
fused decode block (decode_mode 'interpret' here: the block's own kernels in Pallas's interpreter on the
CPU), the layer runs as the block, recorded, and its output matches MaxText's own layer; where MaxText's
config asks for what the block does not compute, MaxText's path runs and the decision says why."""

from __future__ import annotations

import types

import pytest

from tests.requires import require

require("maxtext", extra="maxtext")

from maxtext.layers import moe  # noqa: E402

from moetune.integrations import maxtext as plugin  # noqa: E402
from moetune.integrations.maxtext import decode  # noqa: E402
from moetune.kernels.errors import ConfigInvalid  # noqa: E402
from tests.integrations.maxtext import tiny_model  # noqa: E402

F32 = 1e-5  # float32 products summed in another order
BF16 = 2e-2
BLOCK = "moe_decode_block"


@pytest.fixture(autouse=True)
def not_installed():
    plugin.uninstall()
    yield
    plugin.uninstall()


def _fused(result, tolerance=F32):
    assert result["fused"] == [True], result
    assert result["reasons"][0].startswith("decode_mode='interpret'"), result
    assert result["ops"] == [BLOCK], result  # the block alone: no grouped GEMM of MaxText's path ran
    assert result["out"] < tolerance, result
    assert result["maxtext_dispatched"] == 0  # MaxText's own run never reached moetune


def test_a_decode_step_runs_as_the_fused_block_and_matches_maxtexts_layer():
    _fused(tiny_model.decode_compare({}))


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides, tolerance",
    [
        # Sigmoid scores and norm_topk_prob; the load-balance loss is MaxText's own of the same routing.
        ({"routed_score_func": "sigmoid", "norm_topk_prob": True, "load_balance_loss_weight": 0.01}, F32),
        ({"routed_bias": True}, F32),  # the bias is in the scores that pick and weight alike
        ({"prefuse_moe_weights": True, "megablox": False}, F32),  # one stored gate-up weight
        ({"dtype": "bfloat16", "weight_dtype": "bfloat16"}, BF16),
        ({"dtype": "bfloat16", "weight_dtype": "float32", "float32_gate_logits": True}, BF16),
    ],
    ids=["sigmoid-norm_topk_prob-lb_loss", "routed_bias", "prefused", "bfloat16", "float32-weights"],
)
def test_maxtexts_routing_settings_the_block_computes(overrides, tolerance):
    result = tiny_model.decode_compare(overrides)
    _fused(result, tolerance)
    ours, theirs = result["lb_loss"]
    assert (ours is None) == (theirs is None) and (ours is None or abs(ours - theirs) <= 1e-6 * abs(theirs))


def _maxtexts_path(ran):
    """MaxText's routed path ran, its GEMMs on moetune (its outputs are MaxText's: test_model.py)."""
    return {e.problem.op for e in ran["dispatched"]} == {"grouped_matmul"}


@pytest.mark.parametrize(
    "overrides, named",
    [
        ({"mlp_bias": True}, "MaxText's mlp_bias=True: biases on the experts' GEMMs"),
        ({"mlp_activations": ["gelu", "linear"]}, "MaxText's mlp_activations=['gelu', 'linear']"),
    ],
    ids=["mlp_bias", "gelu"],
)
def test_a_setting_the_block_does_not_compute_keeps_maxtexts_path_and_says_so(overrides, named):
    ran = tiny_model.decode_layer(tiny_model.config(**overrides), moetune=True)
    [decision] = ran["decisions"]
    assert not decision.fused and decision.reason.startswith(named), decision
    assert decision.tokens == 2 and _maxtexts_path(ran)


def test_decode_mode_auto_keeps_maxtexts_path_without_a_tuned_winner_and_says_why():
    ran = tiny_model.decode_layer(tiny_model.config(), moetune=True, decode_mode="auto")
    [decision] = ran["decisions"]
    assert not decision.fused and decision.reason == "not on a GPU" and _maxtexts_path(ran)
    assert decision.problem is not None and decision.problem.key.startswith(f"{BLOCK}/m=2,k=64,n=192,g=8")


def test_more_tokens_than_the_block_takes_run_maxtexts_path_with_no_decision():
    # 2 sequences of 17 tokens: 34 > the block's 32.
    ran = tiny_model.decode_layer(tiny_model.config(), moetune=True, seq=17)
    assert ran["decisions"] == [] and _maxtexts_path(ran)


def _layer(**config):
    defaults = dict(
        model_name="mixtral-8x7b", decoder_block="mixtral", use_random_routing=False, mlp_bias=False,
        mlp_activations=["silu", "linear"], log_required_ragged_buffer_factor=False,
        moe_log_max_load_ratio=False, shard_mode="auto",
    )  # fmt: skip
    return types.SimpleNamespace(
        config=types.SimpleNamespace(**(defaults | config)),
        is_hash_routing=False,
        per_expert_scale=None,
        should_update_load_balance=lambda: config.get("routed_bias_update_rate", 0) > 0,
        get_ragged_buffer_factor=lambda: config.get("ragged_buffer_factor", -1.0),
    )


@pytest.mark.parametrize(
    "config, named",
    [
        (dict(model_name="deepseek3-671b"), "DeepSeek's routing"),
        (dict(model_name="kimi-k2-1t"), "DeepSeek's routing"),
        (dict(decoder_block="deepseek"), "routed_scaling_factor"),
        (dict(decoder_block="llama4"), "Llama 4's routing"),
        (dict(decoder_block="gemma4"), "per-expert scales"),
        (dict(decoder_block="gpt_oss"), "clipped activation"),
        (dict(use_random_routing=True), "use_random_routing=True"),
        (dict(mlp_activations=["gelu", "linear"]), "SwiGLU"),
        (dict(mlp_bias=True), "mlp_bias=True"),
        (dict(routed_bias_update_rate=0.01), "routed_bias_update_rate"),
        (dict(ragged_buffer_factor=1.5), "ragged_buffer_factor=1.5: a bounded buffer drops tokens"),
        (dict(shard_mode="explicit"), "shard_mode='explicit'"),
    ],
)
def test_each_setting_the_block_does_not_compute_is_named(config, named):
    reason = decode.unsupported(_layer(**config))
    assert reason is not None and named in reason and "\n" not in reason


def test_the_served_settings_pass():
    assert decode.unsupported(_layer()) is None
    assert decode.unsupported(_layer(model_name="qwen3-30b-a3b", decoder_block="qwen3_moe")) is None


def test_maxtexts_routing_is_the_one_the_block_computes():
    assert decode.routing_difference(moe.RoutedMoE) is None

    class Other(moe.RoutedMoE):
        def get_topk(self, gate_logits, pre_bias_logits, rngs=None, input_ids=None, forced=None):
            return gate_logits, pre_bias_logits

    assert "RoutedMoE.get_topk is not the one the plug-in knows" in decode.routing_difference(Other)


def test_install_takes_a_decode_mode_and_installed_puts_the_earlier_one_back():
    sparse_matmul = moe.RoutedMoE.sparse_matmul
    with pytest.raises(ConfigInvalid, match="decode_mode='fast'"):
        plugin.install("fast")
    assert not plugin.is_installed()
    plugin.install("kernel")
    assert moe.RoutedMoE.sparse_matmul is not sparse_matmul
    with plugin.installed("interpret"):
        assert plugin.hook._decode_mode() == "interpret"
    assert plugin.is_installed() and plugin.hook._decode_mode() == "kernel"
    plugin.uninstall()
    assert moe.RoutedMoE.sparse_matmul is sparse_matmul and plugin.hook._decode_mode() == "xla"


@pytest.mark.slow
def test_the_block_on_expert_and_tensor_parallel_shards_on_four_cpu_devices():
    """Four host devices in a process of their own: the experts split four ways (each shard its slice at
    group_offset), and two ways with the ffn split two ways; the shards' outputs summed. MaxText's own
    reference runs its ring of experts (XLA:CPU has no ragged_all_to_all)."""
    wide = {"base_mlp_dim": 128, "base_moe_mlp_dim": 128}  # an ffn slice of 64, which the block tiles
    cases = [
        {"decode": True, "overrides": {"ici_expert_parallelism": 4, "ici_fsdp_parallelism": 1}},
        {
            "decode": True,
            "overrides": wide | {"ici_expert_parallelism": 2, "ici_tensor_parallelism": 2},
            "reference": wide
            | {"ici_expert_parallelism": 2, "ici_tensor_parallelism": 2, "use_ring_of_experts": True},
        },
        {"decode": True, "overrides": wide | {"ici_tensor_parallelism": 2, "ici_fsdp_parallelism": 2}},
    ]
    cases[0]["reference"] = cases[0]["overrides"] | {"use_ring_of_experts": True}
    results = tiny_model.on_host_devices(4, cases)
    assert len(results) == 3
    for result in results:
        _fused(result)
