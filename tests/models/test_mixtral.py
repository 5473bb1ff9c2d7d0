"""The Mixtral-shaped decoder on its tiny config: KV-cache decoding equals full recomputation, and the three
MoE paths agree."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.lookup import LOOKUP
from moetune.models import mixtral
from moetune.models.config import MODELS, model_config
from moetune.models.moe_paths import MOE_PATHS, moe_path
from moetune.models.weights import init_params

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
    with pytest.raises(ConfigInvalid, match="unknown model 'mixtral'; known: mixtral_8x7b, tiny"):
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
