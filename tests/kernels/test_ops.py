"""The op registry (moetune.kernels.ops): names, specs, what Problem asks of them, and that the spec can
express the planned ops (FP8 with scale operands, the weight gradient) without a tuner change."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels import ops
from moetune.kernels.backend import Backend
from moetune.kernels.errors import ConfigInvalid, Unsupported
from moetune.kernels.ops import grouped_matmul as gmm
from moetune.kernels.ops.spec import Operand
from moetune.kernels.problem import Problem, problem_of


def test_names_come_from_the_package_and_unknown_names_list_them():
    assert ops.names() == [
        "grouped_matmul",
        "grouped_matmul_drhs",
        "grouped_matmul_fp8",
        "grouped_matmul_geglu",
        "grouped_matmul_swiglu",
        "grouped_matmul_swiglu_fp8",
        "moe_decode_block",
        "moe_decode_block_fp8",
    ]
    assert all(ops.get(name).name == name for name in ops.names())
    with pytest.raises(ConfigInvalid, match="unknown op 'moe_combine'; registered: grouped_matmul, "):
        ops.get("moe_combine")
    with pytest.raises(ConfigInvalid, match="unknown op 'moe_combine'"):
        Problem("moe_combine", m=8, k=8, n=8, g=2)


def test_fusing_finds_the_op_of_each_gated_activation():
    assert ops.fusing("swiglu").name == "grouped_matmul_swiglu"
    assert ops.fusing("geglu").name == "grouped_matmul_geglu"
    assert ops.fusing("relu") is None and ops.fusing("") is None


@pytest.mark.parametrize(
    "op, out_n, accumulators, linear_in_k",
    [
        ("grouped_matmul", 96, 1, True),
        ("grouped_matmul_swiglu", 48, 2, False),
        ("grouped_matmul_geglu", 48, 2, False),
    ],
)
def test_problem_asks_its_spec_for_shapes_flops_and_bytes(op, out_n, accumulators, linear_in_k):
    problem = Problem(op, m=20, k=32, n=96, g=4)
    assert problem.spec is ops.get(op)
    assert problem.out_shape == (20, out_n) and problem.out_n == out_n
    assert problem.flops == 2 * 20 * 32 * 96
    # bf16 lhs, all 4 experts' bf16 weights, int32 group sizes, the bf16 output
    assert problem.bytes_touched == 2 * 20 * 32 + 2 * 4 * 32 * 96 + 4 * 4 + 2 * 20 * out_n
    assert problem.spec.rhs_columns_per_out_column == accumulators
    assert problem.spec.linear_in_k is linear_in_k
    shapes = [
        (s.shape, s.dtype)
        for s in problem.spec.shape_dtypes(dataclasses.replace(problem, transpose_rhs=True))
    ]
    assert shapes == [((20, 32), jnp.bfloat16), ((4, 96, 32), jnp.bfloat16), ((4,), jnp.int32)]


def test_keys_and_dicts_of_the_shipped_ops_keep_their_form():
    problem = Problem("grouped_matmul_swiglu", m=4096, k=4096, n=28672, g=8)
    assert problem.key == (
        "grouped_matmul_swiglu/m=4096,k=4096,n=28672,g=8,lhs=bfloat16,rhs=bfloat16,out=bfloat16,t=0/v1"
    )
    assert problem.to_json() == (
        '{"g": 8, "k": 4096, "lhs_dtype": "bfloat16", "m": 4096, "n": 28672, "op": "grouped_matmul_swiglu", '
        '"out_dtype": "bfloat16", "rhs_dtype": "bfloat16", "schema_version": 1, "transpose_rhs": false}'
    )
    assert Problem.from_json(problem.to_json()) == problem


def test_gated_ops_need_an_even_n():
    for op in ("grouped_matmul_swiglu", "grouped_matmul_geglu"):
        with pytest.raises(ConfigInvalid, match=f"op={op} needs an even n"):
            Problem(op, m=20, k=32, n=95, g=4)
    assert Problem("grouped_matmul", m=20, k=32, n=95, g=4).out_n == 95


def test_problem_of_reads_the_dims_the_spec_names():
    lhs = jax.ShapeDtypeStruct((10, 32), jnp.bfloat16)
    rhs = jax.ShapeDtypeStruct((4, 96, 32), jnp.bfloat16)
    problem = problem_of(
        lhs, rhs, jax.ShapeDtypeStruct((4,), jnp.int32), transpose_rhs=True, op="grouped_matmul_geglu"
    )
    assert (problem.op, problem.m, problem.k, problem.n, problem.g) == ("grouped_matmul_geglu", 10, 32, 96, 4)
    assert problem.out_dtype == "bfloat16"
    assert problem_of(lhs, rhs, transpose_rhs=True, preferred_element_type=jnp.float32).out_dtype == "float32"
    with pytest.raises(ValueError, match="lhs has K=32 but rhs"):
        problem_of(lhs, rhs)
    with pytest.raises(ValueError, match="group_sizes must be integers"):
        problem_of(lhs, rhs, jax.ShapeDtypeStruct((4,), jnp.float32), transpose_rhs=True)


def test_draw_uses_each_operands_spread_and_never_gives_zeros():
    problem = Problem("grouped_matmul", m=256, k=64, n=128, g=2, lhs_dtype="float32", rhs_dtype="float32")
    lhs = np.asarray(problem.spec.draw(problem, "lhs", jax.random.key(0)))
    rhs = np.asarray(problem.spec.draw(problem, "rhs", jax.random.key(1)))
    assert lhs.shape == (256, 64) and rhs.shape == (2, 64, 128)
    assert abs(lhs.std() - 1.0) < 0.05 and abs(rhs.std() - 1 / math.sqrt(64)) < 0.01
    assert np.count_nonzero(lhs) == lhs.size
    with pytest.raises(ConfigInvalid, match="group_sizes is not drawn"):
        problem.spec.draw(problem, "group_sizes", jax.random.key(2))


def test_tolerances_follow_the_output_dtype():
    spec = ops.get("grouped_matmul")
    assert spec.tolerance_for("bfloat16") > spec.tolerance_for("float16") > spec.tolerance_for("float32")


def test_the_grouped_gemms_name_their_cotangent_ops_and_the_weight_gradient_has_none():
    assert ops.get("grouped_matmul").vjp == ops.Vjp(dlhs="grouped_matmul", drhs="grouped_matmul_drhs")
    for gated in ("grouped_matmul_swiglu", "grouped_matmul_geglu"):
        # The backward recomputes the gated product rather than the forward keeping it.
        assert ops.get(gated).vjp == ops.Vjp(
            "grouped_matmul", "grouped_matmul_drhs", product="grouped_matmul"
        )
    assert ops.get("grouped_matmul_drhs").vjp is None


def test_the_spec_expresses_an_fp8_op_with_row_and_column_scales():
    scales = (
        Operand("lhs_scale", lambda p: (p.m,), lambda p: "float32", kind="scale", scales="lhs", layout="row"),
        Operand(
            "rhs_scale",
            lambda p: (p.g, p.n),
            lambda p: "float32",
            kind="scale",
            scales="rhs",
            layout="column",
        ),
    )
    spec = dataclasses.replace(
        ops.get("grouped_matmul"), name="grouped_matmul_fp8_rowwise", operands=(*gmm.OPERANDS, *scales)
    )
    problem = Problem("grouped_matmul", m=16, k=64, n=32, g=2)
    assert [o.name for o in spec.scale_operands] == ["lhs_scale", "rhs_scale"]
    assert [s.shape for s in spec.shape_dtypes(problem)][-2:] == [(16,), (2, 32)]
    with pytest.raises(ConfigInvalid, match="layout='diagonal' is not one of"):
        Operand("s", lambda p: (1,), lambda p: "float32", kind="scale", scales="lhs", layout="diagonal")
    with pytest.raises(ConfigInvalid, match="scales unknown operand out"):
        dataclasses.replace(spec, operands=(*gmm.OPERANDS, dataclasses.replace(scales[0], scales="out")))


@pytest.mark.parametrize("transpose_rhs", [False, True])
def test_the_weight_gradient_spec(transpose_rhs):
    """drhs: out[g] = lhs[rows of g]^T @ dout[rows of g], [G, K, N] (the weights' layout); the ragged
    dimension is contracted, its key is its own."""
    spec = ops.get("grouped_matmul_drhs")
    problem = Problem(spec.name, m=12, k=8, n=4, g=3, lhs_dtype="float32", rhs_dtype="float32")
    problem = dataclasses.replace(problem, transpose_rhs=transpose_rhs)
    lhs, grad = spec.draw(problem, "lhs", jax.random.key(0)), spec.draw(problem, "dout", jax.random.key(1))
    sizes = jnp.asarray([5, 0, 6], jnp.int32)  # row 11 is past the groups
    out = np.asarray(spec.reference(lhs, grad, sizes, transpose_rhs=transpose_rhs))
    assert out.shape == spec.out_shape(problem) == ((3, 4, 8) if transpose_rhs else (3, 8, 4))
    first = np.asarray(lhs[:5]).T @ np.asarray(grad[:5])
    last = np.asarray(lhs[5:11]).T @ np.asarray(grad[5:11])
    for got, want in ((out[0], first), (out[2], last)):
        np.testing.assert_allclose(got, want.T if transpose_rhs else want, rtol=1e-5, atol=1e-5)
    assert not out[1].any()
    assert spec.dims_of(lhs, grad, sizes, transpose_rhs) == (12, 8, 4, 3)
    assert spec.out_grouped and problem.flops == 2 * 12 * 8 * 4
    assert problem.key.startswith("grouped_matmul_drhs/m=12,k=8,n=4,g=3,")
    with pytest.raises(ValueError, match="needs group_sizes"):
        spec.dims_of(lhs, grad, None, False)
    with pytest.raises(ValueError, match="dout must be"):
        spec.dims_of(lhs, grad[:5], sizes, False)


class _Narrow(Backend):
    name = "narrow"
    config_cls = None
    kernels = {"grouped_matmul": "grouped_matmul"}
    kernel_module = "moetune.kernels.backends.xla.kernel"

    def available(self, device):
        return None

    def check_problem(self, problem):
        if problem.lhs_dtype == "float32":
            raise Unsupported("no float32 here")

    def search_space(self, problem, device):
        raise NotImplementedError

    def heuristic(self, problem, device):
        raise NotImplementedError

    def build(self, problem, config):
        raise NotImplementedError


def test_backend_check_declines_ops_outside_its_table_then_asks_its_hook():
    narrow = _Narrow()
    narrow.check(Problem("grouped_matmul", m=8, k=8, n=8, g=2))
    with pytest.raises(Unsupported, match="narrow serves op=grouped_matmul, not op='grouped_matmul_geglu'"):
        narrow.check(Problem("grouped_matmul_geglu", m=8, k=8, n=8, g=2))
    with pytest.raises(Unsupported, match="no float32 here"):
        narrow.check(Problem("grouped_matmul", m=8, k=8, n=8, g=2, lhs_dtype="float32"))
    assert narrow.kernel_for("grouped_matmul").__name__ == "grouped_matmul"
    with pytest.raises(Unsupported, match="not op='grouped_matmul_swiglu'"):
        narrow.kernel_for("grouped_matmul_swiglu")
