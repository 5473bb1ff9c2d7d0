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


def _problem(tokens=TOKENS) -> Problem:
    return Problem(
        "moe_decode_block", tokens, HIDDEN, 2 * INTER, EXPERTS, "float32", "float32", "float32", top_k=TOP_K
    )


def _operands(tokens=TOKENS):
    ks = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(ks[0], (tokens, HIDDEN), jnp.float32)
    logits = jax.random.normal(ks[1], (tokens, EXPERTS), jnp.float32)
    w_gate_up = jax.random.normal(ks[2], (EXPERTS, HIDDEN, 2 * INTER), jnp.float32) / np.sqrt(HIDDEN)
    w_down = jax.random.normal(ks[3], (EXPERTS, INTER, HIDDEN), jnp.float32) / np.sqrt(INTER)
    return x, logits, w_gate_up, w_down


def _winners(*pairs):
    """An overlay of mosaic_gpu winners, (tokens, config) each, and nothing else (no database, no packs)."""
    winners = [Winner("mosaic_gpu", _problem(t), c.to_dict(), median_s=1e-5) for t, c in pairs]
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
