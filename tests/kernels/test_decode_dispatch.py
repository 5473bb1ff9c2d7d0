"""moe_mlp's choice of the fused decode block (layer.decode_choice): "auto" takes it only where the
block's tuned winner for the T bucket is the block, which a sweep timed faster than the unfused path
(the op's baseline); recording() shows which ran, with its config and source."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from moetune.kernels import recording
from moetune.kernels.backends.mosaic_gpu import space_decode
from moetune.kernels.backends.mosaic_gpu.kernel_decode import DecodeBlockConfig
from moetune.kernels.device import DeviceFingerprint, current_fingerprint
from moetune.kernels.lookup import LOOKUP, Winner
from moetune.kernels.moe import layer
from moetune.kernels.moe.reference import moe_mlp_reference
from moetune.kernels.problem import Problem

HOPPER = DeviceFingerprint("NVIDIA H200", "gpu", 132, 150 << 30, "9.0", "", "", "", "")
TOKENS, HIDDEN, INTER, EXPERTS, TOP_K = 4, 64, 32, 8, 2
FUSED = DecodeBlockConfig(block_f=16, block_k=32, block_h=32, block_fd=16, down_split=2)


def _problem(tokens=TOKENS, transpose_rhs=False) -> Problem:
    dtypes = ("float32",) * 3
    return Problem(
        "moe_decode_block", tokens, HIDDEN, 2 * INTER, EXPERTS, *dtypes, transpose_rhs, top_k=TOP_K
    )


def _operands(tokens=TOKENS):
    ks = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(ks[0], (tokens, HIDDEN), jnp.float32)
    logits = jax.random.normal(ks[1], (tokens, EXPERTS), jnp.float32)
    w_gate_up = jax.random.normal(ks[2], (EXPERTS, HIDDEN, 2 * INTER), jnp.float32) / np.sqrt(HIDDEN)
    w_down = jax.random.normal(ks[3], (EXPERTS, INTER, HIDDEN), jnp.float32) / np.sqrt(INTER)
    return x, logits, w_gate_up, w_down


def _winners(*pairs, transpose_rhs=False):
    """An overlay of mosaic_gpu winners, (tokens, config) each, and nothing else (no database, no packs)."""
    winners = [Winner("mosaic_gpu", _problem(t, transpose_rhs), c.to_dict(), median_s=1e-5) for t, c in pairs]
    return LOOKUP.overlay(winners=winners, db=None, packs_dir=None)


def _choose(tokens=TOKENS, **options):
    x, logits, w_gate_up, _ = _operands(tokens)
    return layer.decode_choice(x, logits, w_gate_up, TOP_K, device=HOPPER, **options)


def test_auto_takes_the_block_only_for_a_tuned_winner_that_is_the_block():
    with _winners():
        choice = _choose()
    assert choice.config is None and choice.reason.startswith("no tuned winner for moe_decode_block/m=4,")
    with _winners((TOKENS, FUSED)):
        choice = _choose()
    assert choice.config == FUSED and choice.kernel is not None and not choice.interpret
    assert choice.reason == "the overlay exact winner: the block was timed faster than the unfused path"
    assert (choice.explanation.problem, choice.explanation.backend) == (_problem(), "mosaic_gpu")
    with _winners((TOKENS, space_decode.BASELINE)):
        choice = _choose()
    assert choice.config is None
    assert choice.reason == "the overlay exact winner is the unfused path: it was timed faster than the block"


def test_k_major_weights_are_decided_by_the_blocks_t1_winners():
    x, logits, w_gate_up, w_down = _operands()
    k_major = [jnp.swapaxes(w, 1, 2) for w in (w_gate_up, w_down)]
    choose = lambda: layer.decode_choice(x, logits, k_major[0], TOP_K, device=HOPPER, transpose_weights=True)  # noqa: E731
    with _winners((TOKENS, FUSED)):  # a winner of the [E, H, 2F] block decides nothing for K-major weights
        choice = choose()
    assert choice.config is None and choice.explanation.problem == _problem(transpose_rhs=True)
    assert ",t=1,top_k=2/v3" in choice.reason
    with _winners((TOKENS, FUSED), transpose_rhs=True):
        choice = choose()
    assert choice.config == FUSED and choice.kernel is not None
    assert choice.explanation.problem == _problem(transpose_rhs=True)
    # In the interpreter, moe_mlp runs the block on the K-major weights and gives the layer's output.
    want = moe_mlp_reference(x, logits, w_gate_up, w_down, top_k=TOP_K)
    cpu = current_fingerprint()
    winner = Winner("mosaic_gpu", _problem(transpose_rhs=True), FUSED.to_dict(), fingerprint_hash=cpu.hash)
    # Under jit, as a model calls it: one program to compile rather than one per operation.
    block = jax.jit(
        lambda w_gu, w_d: layer.moe_mlp(
            x, logits, w_gu, w_d, top_k=TOP_K, transpose_weights=True, decode_mode="interpret"
        )
    )
    with LOOKUP.overlay(winners=[winner], db=None, packs_dir=None), recording() as calls:
        out = block(*k_major)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-4, atol=1e-5)
    assert [(c.problem, c.config) for c in calls] == [(_problem(transpose_rhs=True), FUSED)]
    grad = jax.jit(jax.grad(lambda w: block(w, k_major[1]).sum()))(k_major[0])
    want_grad = jax.jit(jax.grad(lambda w: moe_mlp_reference(x, logits, w, w_down, top_k=TOP_K).sum()))(
        w_gate_up
    )
    np.testing.assert_allclose(
        np.asarray(grad), np.swapaxes(np.asarray(want_grad), 1, 2), rtol=1e-4, atol=1e-5
    )


def test_a_winner_of_the_nearest_tuned_bucket_decides_for_its_neighbours():
    with _winners((8, FUSED), (1, space_decode.BASELINE)):
        assert _choose(tokens=4).reason.startswith(
            "the overlay nearest (T=8) winner: the block was timed faster"
        )
        assert "overlay exact winner is the unfused path" in _choose(tokens=1).reason


def test_kernel_forces_the_block_with_the_heuristic_where_the_winner_is_unfused():
    with _winners((TOKENS, space_decode.BASELINE)):
        choice = _choose(decode_mode="kernel")
    assert choice.config == space_decode.heuristic(_problem(), HOPPER) and choice.config.fused
    assert choice.explanation.source == "heuristic (the overlay exact winner is unfused)"
    with _winners():
        assert _choose(decode_mode="kernel").reason == "decode_mode='kernel': the heuristic config"


def test_auto_keeps_the_unfused_path_for_xla_a_local_slice_and_sizes_past_the_block():
    with _winners((TOKENS, FUSED)):
        assert _choose(backend="xla").config is None  # xla's kernels for the block are the unfused path
        assert _choose(sliced=True).reason.startswith("group_offset: the block's winners are tuned for whole")
        x, logits, w_gate_up, _ = _operands(40)
        choice = layer.decode_choice(x, logits, w_gate_up, TOP_K, device=HOPPER)
    assert choice.config is None and "T=40 > 32" in choice.reason


def test_recording_shows_the_block_and_its_config_or_the_unfused_paths_gemms():
    x, logits, w_gate_up, w_down = _operands()
    want = moe_mlp_reference(x, logits, w_gate_up, w_down, top_k=TOP_K)
    cpu = current_fingerprint()
    winner = Winner("mosaic_gpu", _problem(), FUSED.to_dict(), fingerprint_hash=cpu.hash)
    with LOOKUP.overlay(winners=[winner], db=None, packs_dir=None):
        with recording() as calls:
            out = layer.moe_mlp(x, logits, w_gate_up, w_down, top_k=TOP_K, decode_mode="interpret")
        np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-4, atol=1e-5)
        ((call,),) = [calls]
        assert (call.problem, call.backend, call.config, call.source) == (
            _problem(),
            "mosaic_gpu",
            FUSED,
            "overlay exact",
        )
        assert call.backend_reason == "decode_mode='interpret'"
        with recording() as calls:
            layer.moe_mlp(x, logits, w_gate_up, w_down, top_k=TOP_K)  # auto, on a CPU: the unfused path
    assert [c.problem.op for c in calls] == ["grouped_matmul_swiglu", "grouped_matmul"]


def test_an_untuned_bucket_that_auto_passes_over_is_counted_as_a_miss(sqlite_url, monkeypatch):
    from moetune.db import open_store

    open_store(sqlite_url).close()  # created: the lookup never creates one
    monkeypatch.setattr(layer, "current_fingerprint", lambda: HOPPER)  # the block's decision on a Hopper
    x, logits, w_gate_up, w_down = _operands()
    with LOOKUP.overlay(db=sqlite_url, packs_dir=None):
        layer.moe_mlp(x, logits, w_gate_up, w_down, top_k=TOP_K)  # the unfused path runs (on this CPU)
    with open_store(sqlite_url) as store:
        (miss,) = store.misses(backend="mosaic_gpu")
    assert (miss.problem, miss.device_kind) == (_problem(), "NVIDIA H200")
