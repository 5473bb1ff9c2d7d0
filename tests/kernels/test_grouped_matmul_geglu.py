"""The op "grouped_matmul_geglu", added as docs/adding-an-op.md says (one spec file, the xla kernel, xla's
table entry): its reference, dispatch on the CPU, and mosaic_gpu declining it so that dispatch falls
through to xla. The backend contract runs it on xla (tests/kernels/backends/xla/test_xla_contract.py)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from moetune.kernels import call_op, explain, ops
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.problem import problem_of
from moetune.kernels.reference import reference_grouped_matmul, reference_of, relative_error

SIZES = jnp.asarray([5, 0, 9, 3], jnp.int32)  # an empty expert, and 3 rows past the last group (M = 20)
H200 = DeviceFingerprint(
    "NVIDIA H200", "gpu", 132, 150_000_000_000, "9.0", "580.159.04", "", "0.11.2", "0.11.2"
)


def _operands(dtype=jnp.float32):
    key_l, key_r = jax.random.split(jax.random.key(7))
    lhs = jax.random.normal(key_l, (20, 64), jnp.float32)
    rhs = jax.random.normal(key_r, (4, 64, 256), jnp.float32) / 8
    return lhs.astype(dtype), rhs.astype(dtype)


def test_reference_is_tanh_gelu_of_the_gate_columns_times_the_up_columns():
    lhs, rhs = _operands()
    problem = problem_of(lhs, rhs, SIZES, op="grouped_matmul_geglu")
    out = np.asarray(reference_of(problem)(lhs, rhs, SIZES))
    product = np.asarray(reference_grouped_matmul(lhs, rhs, SIZES))
    gate, up = product[:, :128], product[:, 128:]
    gelu = 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate**3)))
    np.testing.assert_allclose(out, gelu * up, rtol=1e-5, atol=1e-6)
    assert out.shape == (20, 128) and not out[17:].any()


def test_call_op_dispatches_it_to_xla_on_the_cpu():
    lhs, rhs = _operands(jnp.bfloat16)
    explanation = explain(lhs, rhs, SIZES, op="grouped_matmul_geglu")
    assert explanation.backend == "xla" and explanation.problem.op == "grouped_matmul_geglu"
    assert explanation.problem.key.startswith("grouped_matmul_geglu/m=20,k=64,n=256,g=4,")
    out = jax.jit(lambda *a: call_op("grouped_matmul_geglu", *a))(lhs, rhs, SIZES)
    ref = reference_of(explanation.problem)(lhs, rhs, SIZES)
    assert out.dtype == jnp.bfloat16 and relative_error(out, ref) < ops.get(
        "grouped_matmul_geglu"
    ).tolerance_for("bfloat16")


def test_mosaic_gpu_declines_it_by_its_table_and_dispatch_falls_through_to_xla():
    lhs, rhs = _operands(jnp.bfloat16)
    geglu = problem_of(lhs, rhs, SIZES, op="grouped_matmul_geglu")
    explanation = explain(geglu, device=H200)
    assert explanation.backend == "xla"
    served = (
        "grouped_matmul, grouped_matmul_drhs, grouped_matmul_fp8, grouped_matmul_swiglu, "
        "grouped_matmul_swiglu_fp8, moe_decode_block, moe_decode_block_fp8"
    )
    assert (
        explanation.declined[0] == f"mosaic_gpu: mosaic_gpu serves op={served}, not op='grouped_matmul_geglu'"
    )
    # SwiGLU of the same shape is in mosaic_gpu's table: declined here only because no GPU runs it.
    swiglu = explain(dataclasses.replace(geglu, op="grouped_matmul_swiglu"), device=H200)
    assert "serves op=" not in swiglu.declined[0]
