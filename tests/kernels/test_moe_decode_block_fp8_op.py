"""The fused MoE decode block on FP8 weights as an op (kernels/ops/moe_decode_block_fp8.py): its operands,
scales and key, its rules, its reference on the dequantized weights, the mosaic_gpu block and its unfused
baseline in Pallas's interpreter, the space's scale-block rule, and moe_mlp's choice of it."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels import ops, recording, registry
from moetune.kernels.backends.mosaic_gpu import space_decode as space
from moetune.kernels.backends.mosaic_gpu.kernel_decode import DecodeBlockConfig
from moetune.kernels.device import DeviceFingerprint, current_fingerprint
from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.lookup import LOOKUP, Winner
from moetune.kernels.moe import layer
from moetune.kernels.ops import fp8_scales
from moetune.kernels.ops import moe_decode_block_fp8 as op
from moetune.kernels.problem import Problem
from moetune.kernels.reference import reference_of, relative_error
from tests.tiers import each_value_fast

SPEC = ops.get("moe_decode_block_fp8")
H200 = DeviceFingerprint("NVIDIA H200", "gpu", 132, 150 << 30, "9.0", "", "", "", "")
LAYOUTS = ("tensor", "row_channel", "block_1x128_128x128")
FP8 = "float8_e4m3fn"


def _problem(
    layout="block_1x128_128x128", transpose_rhs=True, tokens=3, hidden=256, inter=128, experts=8, top_k=2
):
    return Problem(
        "moe_decode_block_fp8", tokens, hidden, 2 * inter, experts, "bfloat16", FP8, "bfloat16",
        transpose_rhs, layout, top_k,
    )  # fmt: skip


def _operands(problem: Problem, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    x, (w_gate_up, gate_up_scale), (w_down, down_scale) = (
        SPEC.draw(problem, o.name, k) for o, k in zip(SPEC.drawn_operands, keys, strict=True)
    )
    logits = SPEC.operand("router_logits").from_routing(problem, [1, 1, 0, 1, 1, 1, 0, 1], seed)
    return x, logits, w_gate_up, gate_up_scale, w_down, down_scale


def test_the_spec_names_its_operands_scales_and_key():
    problem = _problem()
    names = ["x", "router_logits", "w_gate_up", "w_gate_up_scale", "w_down", "w_down_scale"]
    assert [o.name for o in SPEC.operands] == names
    assert [o.name for o in SPEC.drawn_operands] == ["x", "w_gate_up", "w_down"]
    # K-major: w_gate_up [E, 2F, H] with scales [E, 2F/128, H/128]; w_down [E, H, F] with [E, H/128, F/128].
    shapes = [s.shape for s in SPEC.shape_dtypes(problem)]
    assert shapes == [(3, 256), (3, 8), (8, 256, 256), (8, 2, 2), (8, 256, 128), (8, 2, 1)]
    assert op.scale_shape(_problem("row_channel"), "w_down") == (8, 256, 1)  # per output channel (H)
    assert op.scale_shape(_problem("row_channel", False), "w_down") == (8, 1, 256)
    assert op.scale_shape(_problem("tensor"), "w_gate_up") == (8, 1, 1)
    assert problem.key == (
        "moe_decode_block_fp8/m=3,k=256,n=256,g=8,lhs=bfloat16,rhs=float8_e4m3fn,out=bfloat16,t=1,"
        "s=block_1x128_128x128,top_k=2/v3"
    )
    assert Problem.from_json(problem.to_json()) == problem
    assert SPEC.options(problem) == {"transpose_rhs": True, "top_k": 2, "scale_layout": "block_1x128_128x128"}
    # The weights at a byte a value: the 16-bit block's touched bytes less half its weights'.
    bf16 = Problem("moe_decode_block", 3, 256, 256, 8, transpose_rhs=True, top_k=2)
    weights = op.block.touched_experts(bf16) * 3 * 256 * 128
    assert problem.bytes_touched == pytest.approx(bf16.bytes_touched - weights, abs=1)
    assert problem.flops == bf16.flops


def test_the_op_takes_fp8_weights_x_in_its_dtype_and_whole_scale_blocks():
    with pytest.raises(ConfigInvalid, match="takes float8_e4m3fn weights; got rhs=bfloat16"):
        Problem("moe_decode_block_fp8", 1, 256, 256, 8, rhs_dtype="bfloat16", scale_layout="tensor", top_k=2)
    with pytest.raises(ConfigInvalid, match="x and the output in one 16- or 32-bit dtype"):
        Problem(
            "moe_decode_block_fp8", 1, 256, 256, 8, "bfloat16", FP8, "float32", scale_layout="tensor", top_k=2
        )
    with pytest.raises(ConfigInvalid, match="needs H and F multiples of 128; got H=256, F=64"):
        _problem(inter=64)
    with pytest.raises(ConfigInvalid, match="takes scale_layout one of"):
        Problem("moe_decode_block_fp8", 1, 256, 256, 8, "bfloat16", FP8, "bfloat16", top_k=2)
    assert _problem("row_channel", inter=64).n == 128  # per-channel scales need no whole blocks
    s = jax.ShapeDtypeStruct
    x, logits, w = s((3, 256), jnp.bfloat16), s((3, 8), jnp.float32), s((8, 256, 256), jnp.float8_e4m3fn)
    layout = dict(top_k=2, transpose_rhs=True, scale_layout="block_1x128_128x128")
    assert op.problem_of(x, logits, w, **layout) == _problem()


@pytest.mark.parametrize(
    *each_value_fast({"layout": LAYOUTS, "transpose_rhs": {"kn": False, "k_major": True}})
)
def test_the_block_and_its_baseline_meet_the_tolerance_in_the_interpreter(monkeypatch, layout, transpose_rhs):
    problem = _problem(layout, transpose_rhs)
    backend = registry.get("mosaic_gpu")
    monkeypatch.setattr(sys.modules[type(backend).__module__], "current_fingerprint", lambda: H200)
    args = _operands(problem, seed=1)
    assert [a.shape for a in args] == [s.shape for s in SPEC.shape_dtypes(problem)]
    ref = reference_of(problem)(*args)
    # The reference is the 16-bit block's on the dequantized weights.
    weights = (fp8_scales.dequantize(*args[2:4]), fp8_scales.dequantize(*args[4:6]))
    plain = op.block.reference(*args[:2], *weights, transpose_rhs=transpose_rhs, top_k=2)
    np.testing.assert_array_equal(np.asarray(ref), np.asarray(plain))
    fused = backend.build(problem, space.SMALLEST)(*args, interpret=True)
    assert relative_error(fused, ref) < 1e-2  # x stays bf16: a bf16 block's rounding only
    unfused = backend.build(problem, space.BASELINE)(*args)  # moe_mlp's FP8 path, on this CPU
    assert relative_error(unfused, ref) <= SPEC.tolerance_for("bfloat16")
    assert relative_error(unfused, fused) > 1e-2  # it quantizes x and the hidden rows as well


def test_k_tiles_stay_within_one_scale_block():
    problem = _problem(hidden=512, inter=512)
    wide = DecodeBlockConfig(block_f=16, block_k=256, block_h=32, block_fd=32)
    assert space.k_tiles_within_scale_blocks(problem, wide, H200) == (
        "block_k=256 straddles the weights' scale blocks of 128 rows"
    )
    deep = DecodeBlockConfig(block_f=16, block_k=64, block_h=32, block_fd=256)
    assert "block_fd=256 straddles" in space.k_tiles_within_scale_blocks(problem, deep, H200)
    assert (
        space.k_tiles_within_scale_blocks(_problem("row_channel", hidden=512, inter=512), wide, H200) is None
    )
    assert space.k_tiles_within_scale_blocks(problem, space.BASELINE, H200) is None
    assert space.k_tiles_within_scale_blocks in space.VALIDITY_CONSTRAINTS
    # Qwen3-30B-A3B at 8 tokens: the heuristic's pick is a fused config the whole space admits.
    qwen = _problem(tokens=8, hidden=2048, inter=768, experts=128, top_k=8)
    chosen = space.heuristic(qwen, H200)
    assert chosen.fused and chosen.block_k <= 128 and chosen.block_fd <= 128
    assert not any(c(qwen, chosen, H200) for c in space.CONSTRAINTS)


def test_auto_takes_the_fp8_block_only_for_a_tuned_winner_that_is_the_block():
    problem = _problem()
    x, logits, w_gate_up, gate_up_scale, w_down, down_scale = _operands(problem)
    layout = dict(scale_layout=problem.scale_layout, transpose_weights=True)
    choose = lambda: layer.decode_choice(x, logits, w_gate_up, 2, device=H200, **layout)  # noqa: E731
    fused = DecodeBlockConfig(block_f=16, block_k=32, block_h=32, block_fd=32)
    with LOOKUP.overlay(winners=[], db=None, packs_dir=None):
        choice = choose()
    assert choice.kernel is None and choice.reason.startswith(
        f"no tuned winner for {problem.key} on NVIDIA H200"
    )
    for config, taken in ((fused, True), (space.BASELINE, False)):
        winner = Winner("mosaic_gpu", problem, config.to_dict(), median_s=1e-5)
        with LOOKUP.overlay(winners=[winner], db=None, packs_dir=None):
            choice = choose()
        assert (choice.kernel is not None) == taken and choice.explanation.problem == problem
    # In the interpreter moe_mlp runs the FP8 block's winner and recording() names it.
    cpu = current_fingerprint()
    winner = Winner("mosaic_gpu", problem, fused.to_dict(), fingerprint_hash=cpu.hash)
    scales = dict(w_gate_up_scale=gate_up_scale, w_down_scale=down_scale)
    with LOOKUP.overlay(winners=[winner], db=None, packs_dir=None), recording() as calls:
        out = layer.moe_mlp(
            x, logits, w_gate_up, w_down, top_k=2, decode_mode="interpret", **layout, **scales
        )
    assert [(c.problem, c.config, c.source) for c in calls] == [(problem, fused, "overlay exact")]
    ref = reference_of(problem)(x, logits, w_gate_up, gate_up_scale, w_down, down_scale)
    assert relative_error(out, ref) < 1e-2


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["row_channel", "block_1x128_128x128"])
def test_the_fp8_block_on_a_local_slice_of_experts_sums_its_experts_only(layout):
    # Expert parallelism: two shards of four experts each; in the interpreter moe_mlp runs the FP8 block
    # on each shard's weights and scales (group_offset), and the shards add up to the whole layer.
    problem = _problem(layout)
    x, logits, w_gate_up, gate_up_scale, w_down, down_scale = _operands(problem)
    per_expert = lambda s, e: s[e : e + 4] if s.shape[0] == problem.g else s  # noqa: E731

    def shard(e):
        choice = layer.decode_choice(
            x, logits, w_gate_up[e : e + 4], 2, decode_mode="interpret", sliced=True,
            scale_layout=layout, transpose_weights=True,
        )  # fmt: skip
        assert choice.kernel is not None, choice.reason
        return layer.moe_mlp(
            x, logits, w_gate_up[e : e + 4], w_down[e : e + 4], top_k=2, decode_mode="interpret",
            scale_layout=layout, transpose_weights=True, w_gate_up_scale=per_expert(gate_up_scale, e),
            w_down_scale=per_expert(down_scale, e), group_offset=jnp.asarray([e], jnp.int32),
        )  # fmt: skip

    halves = [np.asarray(shard(e), np.float64) for e in (0, 4)]
    ref = np.asarray(reference_of(problem)(x, logits, w_gate_up, gate_up_scale, w_down, down_scale))
    assert relative_error(halves[0] + halves[1], ref) < 1e-2
    assert relative_error(halves[0], ref) > 0.1  # one shard alone is not the layer
