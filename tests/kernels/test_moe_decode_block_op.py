"""The fused MoE decode block as an op (kernels/ops/moe_decode_block.py): its operands and dims, its
float32 reference, its tolerance against the block's kernels, FLOPs and bytes, and the router logits it
makes from a routing draw."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels import ops
from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.moe import decode_block
from moetune.kernels.moe.reference import moe_mlp_reference
from moetune.kernels.ops import moe_decode_block as op
from moetune.kernels.problem import Problem
from moetune.kernels.reference import reference_of, relative_error

SPEC = ops.get("moe_decode_block")


def _problem(
    tokens=3, hidden=64, inter=32, experts=8, top_k=2, dtype="float32", transpose_rhs=False
) -> Problem:
    return Problem(
        "moe_decode_block",
        tokens,
        hidden,
        2 * inter,
        experts,
        dtype,
        dtype,
        dtype,
        transpose_rhs,
        top_k=top_k,
    )


def _operands(problem: Problem, sizes, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    x, w_gate_up, w_down = (
        SPEC.draw(problem, o.name, k) for o, k in zip(SPEC.drawn_operands, keys, strict=True)
    )
    logits = SPEC.operand("router_logits").from_routing(problem, sizes, seed)
    return x, logits, w_gate_up, w_down


def test_the_spec_names_its_operands_dims_and_facts():
    problem = _problem(tokens=8, hidden=2048, inter=768, experts=128, top_k=8, dtype="bfloat16")
    assert [o.name for o in SPEC.operands] == ["x", "router_logits", "w_gate_up", "w_down"]
    assert [o.name for o in SPEC.drawn_operands] == ["x", "w_gate_up", "w_down"]
    assert [o.weights for o in SPEC.operands] == [False, False, True, True]
    shapes = [s.shape for s in SPEC.shape_dtypes(problem)]
    assert shapes == [(8, 2048), (8, 128), (128, 2048, 1536), (128, 768, 2048)]
    assert problem.out_shape == (8, 2048) and problem.rhs_shape == (128, 2048, 1536)
    assert SPEC.routed and SPEC.options(problem) == {"transpose_rhs": False, "top_k": 8}
    assert SPEC.routing_rows(problem) == 64 and SPEC.expert_capacity(problem) == 8
    assert problem.flops == 2 * 64 * 2048 * 1536 + 2 * 64 * 768 * 2048
    # The touched experts' weights, not all 128 experts': at 8 tokens about 52 of them.
    touched = 128 * (1 - (1 - 8 / 128) ** 8)
    expert_bytes = (2048 * 1536 + 768 * 2048) * 2
    assert problem.bytes_touched == round(touched * expert_bytes) + 8 * 2048 * 4 + 8 * 128 * 4
    assert not SPEC.epilogue and ops.fusing("swiglu").name == "grouped_matmul_swiglu"


def test_dims_and_the_problem_of_a_call():
    s = jax.ShapeDtypeStruct
    x, logits, w = s((5, 64), jnp.bfloat16), s((5, 8), jnp.float32), s((8, 64, 96), jnp.bfloat16)
    assert op.dims_of(x, logits, w, False) == (5, 64, 96, 8)
    assert op.problem_of(x, logits, w, top_k=2) == _problem(5, 64, 48, 8, 2, "bfloat16")
    with pytest.raises(ValueError, match=r"router_logits must be \[T=5, E\]"):
        op.dims_of(x, s((4, 8), jnp.float32), w, False)
    with pytest.raises(ValueError, match=r"w_gate_up must be \[E=8, H=64, 2F\]"):
        op.dims_of(x, logits, s((8, 96, 64), jnp.bfloat16), False)
    # K-major weights: w_gate_up [E, 2F, H], the Problem's t=1.
    k_major = s((8, 96, 64), jnp.bfloat16)
    assert op.dims_of(x, logits, k_major, True) == (5, 64, 96, 8)
    want = dataclasses.replace(_problem(5, 64, 48, 8, 2, "bfloat16"), transpose_rhs=True)
    assert op.problem_of(x, logits, k_major, top_k=2, transpose_rhs=True) == want
    assert [o.shape for o in SPEC.shape_dtypes(want)][2:] == [(8, 96, 64), (8, 64, 48)]
    with pytest.raises(ValueError, match=r"w_gate_up must be \[E=8, 2F, H=64\]"):
        op.dims_of(x, logits, w, True)


def test_the_router_logits_pick_exactly_the_drawn_experts():
    problem = _problem(tokens=4, experts=8, top_k=3)
    sizes = [4, 0, 1, 2, 3, 0, 1, 1]  # 12 rows, at most 4 on an expert
    logits = np.asarray(SPEC.operand("router_logits").from_routing(problem, sizes, 7))
    assert logits.shape == (4, 8) and logits.dtype == np.float32
    picked = np.asarray(jax.lax.top_k(jnp.asarray(logits), 3)[1])
    assert np.bincount(picked.reshape(-1), minlength=8).tolist() == sizes
    chosen = np.zeros_like(logits, dtype=bool)
    np.put_along_axis(chosen, picked, True, axis=1)
    assert logits[chosen].min() >= logits[~chosen].max() + 1.0  # no rounding can change the pick
    again = SPEC.operand("router_logits").from_routing(problem, sizes, 7)
    assert np.array_equal(np.asarray(again), logits)
    with pytest.raises(ConfigInvalid, match="at most T=4 on one"):
        SPEC.operand("router_logits").from_routing(problem, [5, 0, 0, 2, 3, 0, 1, 1], 7)


def test_the_reference_is_the_float32_moe_reference_renormalized():
    problem = _problem()
    x, logits, w_gate_up, w_down = _operands(problem, [1, 1, 1, 0, 1, 1, 0, 1])
    out = reference_of(problem)(x, logits, w_gate_up, w_down)
    want = moe_mlp_reference(x, logits, w_gate_up, w_down, top_k=2, renormalize=True)
    assert out.shape == (3, 64) and out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_blocks_kernels_meet_the_tolerance(dtype):
    problem = _problem(dtype=dtype)
    x, logits, w_gate_up, w_down = _operands(problem, [0, 2, 1, 1, 0, 1, 0, 1], seed=3)
    config = decode_block.DecodeConfig(block_f=16, block_k=16, block_h=16, block_fd=16, down_split=2)
    out = decode_block.decode_block(x, logits, w_gate_up, w_down, top_k=2, config=config, interpret=True)
    ref = reference_of(problem)(x, logits, w_gate_up, w_down)
    error = relative_error(out, ref)
    assert error <= SPEC.tolerance_for(dtype)
    assert dtype == "float32" or error > SPEC.tolerance_for("float32")  # bf16 rounds: a real margin


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_blocks_kernels_on_k_major_weights_meet_the_tolerance(dtype):
    # t=1: w_gate_up [E, 2F, H] and w_down [E, H, F], drawn in that layout; the reference transposes them
    # back, so it is the [E, H, 2F] block's on the same values.
    problem = _problem(dtype=dtype, transpose_rhs=True)
    x, logits, w_gate_up, w_down = _operands(problem, [0, 2, 1, 1, 0, 1, 0, 1], seed=3)
    assert w_gate_up.shape == (8, 64, 64) and w_down.shape == (8, 64, 32)
    ref = reference_of(problem)(x, logits, w_gate_up, w_down)
    k_by_n = reference_of(_problem(dtype=dtype))(
        x, logits, *(jnp.swapaxes(w, 1, 2) for w in (w_gate_up, w_down))
    )
    np.testing.assert_array_equal(np.asarray(ref), np.asarray(k_by_n))
    config = decode_block.DecodeConfig(block_f=16, block_k=16, block_h=16, block_fd=16, up_split=2)
    out = decode_block.decode_block(
        x, logits, w_gate_up, w_down, top_k=2, config=config, transpose_weights=True, interpret=True
    )
    assert relative_error(out, ref) <= SPEC.tolerance_for(dtype)
