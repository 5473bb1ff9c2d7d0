"""The Mixtral-shaped decoder on its tiny configs: KV-cache decoding equals full recomputation, and the three
MoE paths agree; the Qwen3-shaped preset (many small experts, q/k RMSNorm) and shared experts likewise."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels.api import explain
from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.lookup import LOOKUP
from moetune.kernels.moe import moe_problems
from moetune_lab.model import mixtral
from moetune_lab.model.config import MODELS, model_config
from moetune_lab.model.kernel_choices import DEFAULT_CHOICES, KernelChoices
from moetune_lab.model.moe_paths import MOE_PATHS, moe_path
from moetune_lab.model.weights import init_params

BATCH, PROMPT, STEPS = 2, 7, 4


@pytest.fixture(autouse=True)
def no_database():
    with LOOKUP.using_db(None):
        yield


@pytest.fixture(scope="module")
def f32_model():
    # float32, so that cached and recomputed attention agree to rounding and no routing tie can flip.
    config = dataclasses.replace(model_config("tiny"), dtype="float32")
    return config, init_params(config, seed=0)


def _tokens(config, length, seed=1):
    return jax.random.randint(jax.random.key(seed), (BATCH, length), 0, config.vocab, dtype=jnp.int32)


def _junk_cache(config, length):
    # Cache slots past the fill hold garbage, not zeros: attention must mask them, not rely on them.
    shape = (BATCH, config.kv_heads, length, config.head_dim)
    junk = lambda i: jnp.full(shape, 100.0 + i, jnp.dtype(config.dtype))
    return mixtral.KVCache(
        keys=tuple(junk(i) for i in range(config.layers)),
        values=tuple(junk(-i) for i in range(config.layers)),
    )


def test_prefill_and_decode_steps_equal_full_recompute(f32_model):
    config, params = f32_model
    tokens = _tokens(config, PROMPT + STEPS)
    full = mixtral.forward_full(params, tokens, config=config, moe_path="moetune")
    cache = _junk_cache(config, PROMPT + STEPS)
    logits, cache = mixtral.prefill(params, tokens[:, :PROMPT], cache, config=config, moe_path="moetune")
    np.testing.assert_allclose(logits, full[:, PROMPT - 1], rtol=1e-4, atol=1e-4)
    for i in range(STEPS):
        pos = PROMPT + i
        logits, cache = mixtral.decode_step(
            params, tokens[:, pos], cache, pos, config=config, moe_path="moetune"
        )
        np.testing.assert_allclose(logits, full[:, pos], rtol=1e-4, atol=1e-4, err_msg=f"position {pos}")


def test_decode_loop_emits_the_greedy_tokens_of_full_recompute(f32_model):
    config, params = f32_model
    prompt = _tokens(config, PROMPT, seed=2)
    cache = mixtral.KVCache.empty(config, BATCH, PROMPT + STEPS)
    logits, cache = mixtral.prefill(params, prompt, cache, config=config, moe_path="moetune")
    first = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    emitted, _ = mixtral.decode_loop(
        params, first, cache, PROMPT, steps=STEPS, config=config, moe_path="moetune"
    )
    assert emitted.shape == (BATCH, STEPS)
    sequence = jnp.concatenate([prompt, first[:, None], emitted], axis=1)
    full = mixtral.forward_full(params, sequence, config=config, moe_path="moetune")
    greedy = np.asarray(jnp.argmax(full[:, PROMPT : PROMPT + STEPS], axis=-1))
    np.testing.assert_array_equal(np.asarray(emitted), greedy)


def test_the_three_moe_paths_agree_on_the_bf16_model():
    config = model_config("tiny")
    params = init_params(config, seed=3)
    tokens = _tokens(config, 12, seed=4)
    logits = {path: mixtral.forward_full(params, tokens, config=config, moe_path=path) for path in MOE_PATHS}
    reference = np.asarray(logits["dense"], np.float64)
    for path in ("ragged", "moetune"):
        value = np.asarray(logits[path], np.float64)
        rel_l2 = np.linalg.norm(value - reference) / np.linalg.norm(reference)
        assert rel_l2 < 2e-2, f"{path}: rel_l2={rel_l2:.3g} against dense"


def test_weights_are_deterministic_per_seed_and_shaped_like_the_config():
    config = model_config("tiny")
    a, b, c = init_params(config, 5), init_params(config, 5), init_params(config, 6)
    layer = a.layers[0]
    assert len(a.layers) == config.layers
    assert layer.w_gate_up.shape == (config.experts, config.hidden, 2 * config.intermediate)
    assert layer.w_down.shape == (config.experts, config.intermediate, config.hidden)
    assert layer.wqkv.shape == (config.hidden, (config.heads + 2 * config.kv_heads) * config.head_dim)
    assert layer.w_gate_up.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(a.layers[1].w_down), np.asarray(b.layers[1].w_down))
    assert not np.array_equal(np.asarray(a.layers[1].w_down), np.asarray(c.layers[1].w_down))
    assert not np.array_equal(np.asarray(a.layers[0].w_down), np.asarray(a.layers[1].w_down))
    # Variance 1/fan_in: a unit input keeps unit scale through a projection.
    assert 0.8 < float(jnp.std(layer.wqkv.astype(jnp.float32))) * config.hidden**0.5 < 1.2


def test_mixtral_preset_has_mixtral_8x7b_shapes():
    mixtral_8x7b = MODELS["mixtral_8x7b"]
    assert (mixtral_8x7b.hidden, mixtral_8x7b.intermediate, mixtral_8x7b.layers) == (4096, 14336, 32)
    assert (mixtral_8x7b.heads, mixtral_8x7b.kv_heads, mixtral_8x7b.head_dim) == (32, 8, 128)
    assert (mixtral_8x7b.experts, mixtral_8x7b.top_k, mixtral_8x7b.vocab) == (8, 2, 32000)
    # 32 layers x 8 experts x 3 x 4096 x 14336 bf16: the ~90 GB that must exist once on the GPU.
    assert mixtral_8x7b.expert_weight_bytes == 90_194_313_216
    assert model_config("mixtral_8x7b", layers=2).layers == 2


def test_bad_names_and_shapes_are_rejected_with_the_choices():
    with pytest.raises(
        ConfigInvalid, match="unknown model 'mixtral'; known: mixtral_8x7b, qwen3_30b_a3b, qwen3_next_80b_a3b"
    ):
        model_config("mixtral")
    with pytest.raises(ConfigInvalid, match="layers=0"):
        model_config("tiny", layers=0)
    with pytest.raises(ConfigInvalid, match="heads=6 is not a multiple of kv_heads=4"):
        dataclasses.replace(model_config("tiny"), heads=6, kv_heads=4)
    with pytest.raises(ConfigInvalid, match="unknown MoE path 'fast'; known: dense, ragged, moetune"):
        moe_path("fast")


def test_the_layers_share_one_lowering_of_the_moe_block():
    # The moetune path's kernels are lowered per call site: the layers must call one shared function, not
    # inline a copy each (32 copies of the Mosaic GPU kernels took minutes to compile on the H200).
    config = dataclasses.replace(model_config("tiny"), layers=3)
    params = init_params(config, seed=0)
    text = mixtral.forward_full.lower(params, _tokens(config, 5), config=config, moe_path="moetune").as_text()
    assert text.count("func.func private @moe_mlp(") == 1
    assert text.count("call @moe_mlp(") == config.layers


def _prefill_and_decode(config, params, tokens, path, choices=DEFAULT_CHOICES):
    """Logits [1 + STEPS, B, V]: the prompt's last position's from prefill, then each decode step's."""
    static = {"config": config, "moe_path": path, "choices": choices}
    cache = mixtral.KVCache.empty(config, BATCH, PROMPT + STEPS)
    logits, cache = mixtral.prefill(params, tokens[:, :PROMPT], cache, **static)
    steps = [logits]
    for i in range(STEPS):
        logits, cache = mixtral.decode_step(params, tokens[:, PROMPT + i], cache, PROMPT + i, **static)
        steps.append(logits)
    return np.stack([np.asarray(step) for step in steps])


@pytest.fixture(scope="module")
def f32_qwen3():
    config = dataclasses.replace(model_config("tiny_qwen3"), dtype="float32")
    return config, init_params(config, seed=0)


def test_qwen3_preset_has_qwen3_30b_a3b_shapes():
    qwen3 = MODELS["qwen3_30b_a3b"]
    assert (qwen3.hidden, qwen3.intermediate, qwen3.layers, qwen3.vocab) == (2048, 768, 48, 151936)
    assert (qwen3.heads, qwen3.kv_heads, qwen3.head_dim) == (32, 4, 128)
    assert (qwen3.experts, qwen3.top_k, qwen3.qk_norm, qwen3.shared_experts) == (128, 8, True, 0)
    tiny = MODELS["tiny_qwen3"]
    assert tiny.layers == 2 and tiny.qk_norm and tiny.heads * tiny.head_dim > tiny.hidden


def test_the_qwen3_shaped_model_decodes_alike_on_the_moetune_and_dense_paths(f32_qwen3):
    """Prefill and decode steps on the xla backend: moetune's routed layer against the dense reference,
    and both against full recomputation."""
    config, params = f32_qwen3
    tokens = _tokens(config, PROMPT + STEPS, seed=5)
    for problem in moe_problems(BATCH, config.hidden, config.intermediate, config.experts, config.top_k):
        assert explain(problem).backend == "xla"
    moetune, dense = (_prefill_and_decode(config, params, tokens, path) for path in ("moetune", "dense"))
    np.testing.assert_allclose(moetune, dense, rtol=1e-4, atol=1e-4)
    full = mixtral.forward_full(params, tokens, config=config, moe_path="moetune")
    np.testing.assert_allclose(
        moetune, np.moveaxis(np.asarray(full[:, PROMPT - 1 :]), 1, 0), rtol=1e-4, atol=1e-4
    )
    # The q/k norm is part of the model: without it the same weights give other logits.
    plain = dataclasses.replace(config, qk_norm=False)
    unnormed = mixtral.forward_full(params, tokens, config=plain, moe_path="moetune")
    assert not np.allclose(np.asarray(unnormed), np.asarray(full), rtol=1e-2, atol=1e-2)


def test_the_qwen3_shaped_decode_attends_with_qk_norm_in_the_interpreted_kernels(f32_qwen3):
    config, params = f32_qwen3
    tokens = _tokens(config, PROMPT + STEPS, seed=6)
    xla = _prefill_and_decode(config, params, tokens, "moetune", KernelChoices(decode_attention="xla"))
    kernel = _prefill_and_decode(
        config, params, tokens, "moetune", KernelChoices(decode_attention="interpret")
    )
    np.testing.assert_allclose(kernel, xla, rtol=1e-4, atol=1e-4)


def test_shared_experts_are_a_dense_mlp_on_every_path():
    config = dataclasses.replace(
        model_config("tiny"), dtype="float32", shared_experts=2, shared_intermediate=24
    )
    params = init_params(config, seed=3)
    layer = params.layers[0]
    assert layer.w_shared_gate_up.shape == (config.hidden, 2 * 48) and layer.w_shared_down.shape == (48, 64)
    # The other weights are those of the same model without shared experts.
    without = dataclasses.replace(config, shared_experts=0, shared_intermediate=0)
    np.testing.assert_array_equal(
        np.asarray(init_params(without, 3).layers[0].w_down), np.asarray(layer.w_down)
    )
    tokens = _tokens(config, 9, seed=7)
    logits = {
        path: np.asarray(mixtral.forward_full(params, tokens, config=config, moe_path=path))
        for path in MOE_PATHS
    }
    for path in ("ragged", "moetune"):
        np.testing.assert_allclose(logits[path], logits["dense"], rtol=1e-4, atol=1e-4, err_msg=path)
    routed_only = mixtral.forward_full(params, tokens, config=without, moe_path="moetune")
    assert not np.allclose(np.asarray(routed_only), logits["moetune"], rtol=1e-2, atol=1e-2)
    # One MoE block is the routed layer plus the dense MLP of the normed rows.
    x = jax.random.normal(jax.random.key(8), (1, 5, config.hidden))
    block = mixtral._moe_block(config, layer, x, "moetune", DEFAULT_CHOICES)
    routed = mixtral._moe_block(without, layer, x, "moetune", DEFAULT_CHOICES)
    h = mixtral.rms_norm(x[0], layer.moe_norm, config.norm_eps)
    np.testing.assert_allclose(block[0] - routed[0], mixtral.shared_experts(layer, h), rtol=1e-5, atol=1e-5)


def test_shared_experts_read_the_gather_kernels_rows_in_decode(monkeypatch):
    """With norm_route_gather on, the shared experts take each token's normed row from the kernel's
    output (no norm of their own): the same decode as XLA's ops."""
    from moetune_lab.model import norm_router

    config = dataclasses.replace(
        model_config("tiny"), dtype="float32", shared_experts=1, shared_intermediate=32
    )
    params = init_params(config, seed=4)
    tokens = _tokens(config, PROMPT + STEPS, seed=8)
    calls = []
    kernel = norm_router.norm_route_gather
    monkeypatch.setattr(
        norm_router, "norm_route_gather", lambda *a, **kw: calls.append(1) or kernel(*a, **kw)
    )
    with jax.default_matmul_precision("float32"):
        xla = _prefill_and_decode(config, params, tokens, "moetune", KernelChoices(norm_route_gather="xla"))
        assert not calls
        interpret = KernelChoices(norm_route_gather="interpret")
        gathered = _prefill_and_decode(config, params, tokens, "moetune", interpret)
    assert calls  # traced into the decode steps
    np.testing.assert_allclose(gathered, xla, rtol=1e-4, atol=1e-4)
