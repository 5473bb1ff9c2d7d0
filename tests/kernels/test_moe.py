"""The routed MoE layer (moetune.kernels.moe) against the dense reference, on the CPU's xla backend."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels.api import problem_of
from moetune.kernels.errors import ConfigInvalid, Unsupported
from moetune.kernels.moe import layer as moe_module
from moetune.kernels.moe import moe_mlp, moe_problems, route, sort_by_expert
from moetune.kernels.moe.reference import combine_matrix, moe_mlp_reference

pytestmark = pytest.mark.slow  # the second tier: seconds per case on a CPU

# Jitted: the reference run op by op costs more compile time than the whole layer.
reference = jax.jit(moe_mlp_reference, static_argnames=("top_k", "renormalize", "activation"))
routed = jax.jit(moe_mlp, static_argnames=("top_k", "renormalize", "activation", "backend", "fuse"))


def _inputs(tokens, hidden, intermediate, experts, *, seed=0, dtype=jnp.float32):
    k = jax.random.split(jax.random.key(seed), 4)
    x = jax.random.normal(k[0], (tokens, hidden), jnp.float32)
    logits = jax.random.normal(k[1], (tokens, experts), jnp.float32)
    w_gate_up = jax.random.normal(k[2], (experts, hidden, 2 * intermediate)) / np.sqrt(hidden)
    w_down = jax.random.normal(k[3], (experts, intermediate, hidden)) / np.sqrt(intermediate)
    return x.astype(dtype), logits, w_gate_up.astype(dtype), w_down.astype(dtype)


def _rel_l2(value, reference):
    value, reference = np.asarray(value, np.float64), np.asarray(reference, np.float64)
    return np.linalg.norm(value - reference) / np.linalg.norm(reference)


@pytest.mark.parametrize(
    "tokens, experts, top_k, renormalize",
    [
        (1, 8, 2, True),  # decode: one token, most experts empty
        (37, 8, 2, False),  # odd token count, full-softmax weights (Qwen-MoE style)
        (64, 4, 1, True),  # top-1 (Switch style): renormalised weights are all 1
        (96, 16, 4, False),  # more experts, wider top-k
        (40, 32, 2, True),  # past COMPARE_MAX_EXPERTS: lax.top_k and the argsort
        (5, 8, 8, True),  # every expert for every token
    ],
)
def test_moe_mlp_matches_reference(tokens, experts, top_k, renormalize):
    x, logits, w_gate_up, w_down = _inputs(tokens, 32, 48, experts, seed=tokens)
    out = routed(x, logits, w_gate_up, w_down, top_k=top_k, renormalize=renormalize)
    expected = reference(x, logits, w_gate_up, w_down, top_k=top_k, renormalize=renormalize)
    assert out.shape == (tokens, 32) and out.dtype == jnp.float32
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-5)


def test_empty_experts_get_no_rows_and_the_result_still_matches():
    x, logits, w_gate_up, w_down = _inputs(40, 32, 48, 8, seed=3)
    # Only experts 1, 5 and 6 can win: the others are pushed far below.
    logits = logits + jnp.where(jnp.isin(jnp.arange(8), jnp.array([1, 5, 6])), 0.0, -30.0)
    rows = sort_by_expert(route(logits, 2, True).expert_ids, 8)
    sizes = np.asarray(rows.group_sizes)
    assert sizes.sum() == 80 and set(np.flatnonzero(sizes == 0)) == {0, 2, 3, 4, 7}
    out = moe_mlp(x, logits, w_gate_up, w_down, top_k=2)
    np.testing.assert_allclose(
        out, moe_mlp_reference(x, logits, w_gate_up, w_down, top_k=2), rtol=2e-5, atol=2e-5
    )


def test_bf16_layer_is_within_bf16_rounding_of_the_float32_reference():
    x, logits, w_gate_up, w_down = _inputs(128, 64, 96, 8, seed=7, dtype=jnp.bfloat16)
    out = routed(x, logits, w_gate_up, w_down, top_k=2)
    expected = reference(*[a.astype(jnp.float32) for a in (x, logits, w_gate_up, w_down)], top_k=2)
    assert out.dtype == jnp.bfloat16
    # bf16 keeps 8 bits of mantissa (relative rounding 2^-9); three rounded stages stay well inside 2e-2.
    assert _rel_l2(out, expected) < 2e-2


def test_geglu_activation_matches_reference():
    x, logits, w_gate_up, w_down = _inputs(24, 32, 48, 4, seed=11)
    out = routed(x, logits, w_gate_up, w_down, top_k=2, activation="geglu")
    expected = reference(x, logits, w_gate_up, w_down, top_k=2, activation="geglu")
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-5)
    swiglu = reference(x, logits, w_gate_up, w_down, top_k=2)
    assert _rel_l2(out, swiglu) > 1e-2  # the activation is really applied


@pytest.mark.parametrize("renormalize", [True, False])
def test_routing_weights_equal_the_reference_combine_matrix(renormalize):
    logits = jax.random.normal(jax.random.key(5), (50, 8))
    routing = route(logits, 3, renormalize)
    dense = np.zeros((50, 8), np.float32)
    np.put_along_axis(dense, np.asarray(routing.expert_ids), np.asarray(routing.weights), axis=1)
    np.testing.assert_allclose(dense, combine_matrix(logits, 3, renormalize), rtol=1e-6, atol=1e-7)
    sums = np.asarray(routing.weights).sum(axis=1)
    if renormalize:
        np.testing.assert_allclose(sums, 1.0, rtol=1e-6)
    else:
        assert np.all(sums < 1.0)


def test_route_refuses_a_top_k_beyond_the_experts():
    with pytest.raises(ConfigInvalid, match="top_k=3"):
        route(jnp.zeros((4, 2)), 3, renormalize=True)


def test_sort_by_expert_worked_example():
    rows = sort_by_expert(jnp.array([[2, 0], [1, 2], [0, 1]], jnp.int32), 3)
    assert rows.row_token.tolist() == [0, 2, 1, 2, 0, 1]
    assert rows.slot_row.tolist() == [4, 0, 2, 5, 1, 3]
    assert rows.group_sizes.tolist() == [2, 2, 2]


@pytest.mark.parametrize("experts, top_k", [(4, 1), (8, 2), (8, 8), (16, 4)])
def test_top_k_by_comparison_equals_lax_top_k_with_ties_and_masked_experts(monkeypatch, experts, top_k):
    # Logits on a coarse grid tie often (signed zeros among them); -inf experts (masked out) must still
    # come back as distinct ids; NaNs order by sign, as in lax.top_k.
    logits = jnp.round(jax.random.normal(jax.random.key(experts + top_k), (300, experts)) * 2) / 2
    logits = logits.at[::7, : experts // 2].set(-jnp.inf)
    logits = logits.at[::11, 0].set(jnp.nan).at[::13, -1].set(-jnp.nan)
    values, _ = moe_module._top_k_by_comparison(logits, top_k)
    want_values, _ = jax.lax.top_k(logits, top_k)
    np.testing.assert_array_equal(values, want_values)
    assert np.array_equal(np.signbit(values), np.signbit(want_values))  # -0.0 stays -0.0
    got = route(logits, top_k, renormalize=False)
    monkeypatch.setattr(moe_module, "COMPARE_MAX_EXPERTS", 0)  # lax.top_k
    want = route(logits, top_k, renormalize=False)
    assert got.expert_ids.tolist() == want.expert_ids.tolist()
    np.testing.assert_array_equal(got.weights, want.weights)


@pytest.mark.parametrize("tokens, top_k, experts", [(1, 2, 8), (5, 2, 3), (16, 4, 8), (32, 2, 2)])
def test_sort_by_comparison_equals_the_stable_argsort(monkeypatch, tokens, top_k, experts):
    ids = jax.random.randint(jax.random.key(tokens), (tokens, top_k), 0, experts, jnp.int32)
    assert tokens * top_k <= moe_module.COMPARE_MAX_ROWS
    got = sort_by_expert(ids, experts)
    monkeypatch.setattr(moe_module, "COMPARE_MAX_ROWS", 0)  # argsort and scatter
    want = sort_by_expert(ids, experts)
    for field in ("row_token", "slot_row"):
        assert getattr(got, field).tolist() == getattr(want, field).tolist(), field
    assert got.group_sizes.tolist() == np.bincount(np.asarray(ids).ravel(), minlength=experts).tolist()


def _recording(monkeypatch):
    """Patch the layer's dispatched calls (the plain GEMM and `call_op` for the fused ones) to record the
    Problem of each call."""
    seen = []
    plain, any_op = moe_module.grouped_matmul, moe_module.call_op

    def record(op, lhs, rhs, group_sizes, rows=None):
        lhs = lhs if rows is None else jax.ShapeDtypeStruct((rows, lhs.shape[1]), lhs.dtype)
        seen.append(problem_of(lhs, rhs, group_sizes, op=op))

    def recording_plain(lhs, rhs, group_sizes, **kwargs):
        record("grouped_matmul", lhs, rhs, group_sizes, kwargs.get("rows"))
        return plain(lhs, rhs, group_sizes, **kwargs)

    def recording_op(op, lhs, rhs, group_sizes, **kwargs):
        record(op, lhs, rhs, group_sizes, kwargs.get("rows"))
        return any_op(op, lhs, rhs, group_sizes, **kwargs)

    monkeypatch.setattr(moe_module, "grouped_matmul", recording_plain)
    monkeypatch.setattr(moe_module, "call_op", recording_op)
    return seen


@pytest.mark.parametrize("fuse", [True, False])
def test_both_gemms_dispatch_the_problems_moe_problems_lists(monkeypatch, fuse):
    seen = _recording(monkeypatch)
    x, logits, w_gate_up, w_down = _inputs(24, 32, 48, 4, dtype=jnp.bfloat16)
    jax.jit(lambda *a: moe_mlp(*a, top_k=2, fuse=fuse)).lower(x, logits, w_gate_up, w_down)
    assert tuple(seen) == moe_problems(24, 32, 48, 4, 2, "bfloat16", fuse=fuse)
    op = "grouped_matmul_swiglu" if fuse else "grouped_matmul"
    assert seen[0].key == f"{op}/m=48,k=32,n=96,g=4,lhs=bfloat16,rhs=bfloat16,out=bfloat16,t=0/v1"


def test_geglu_fuses_where_served_and_a_backend_without_the_fused_op_takes_the_unfused_path(
    monkeypatch, probe_backends
):
    seen = _recording(monkeypatch)
    x, logits, w_gate_up, w_down = _inputs(24, 32, 48, 4)
    jax.jit(lambda *a: moe_mlp(*a, top_k=2, activation="geglu")).lower(x, logits, w_gate_up, w_down)
    assert [p.op for p in seen] == ["grouped_matmul_geglu", "grouped_matmul"]
    assert tuple(seen) == moe_problems(24, 32, 48, 4, 2, "float32", activation="geglu")
    # A backend that serves only the plain GEMM does not serve the fused op: it runs both plain GEMMs.
    probe = probe_backends("plain_only")
    seen.clear()
    jax.jit(lambda *a: moe_mlp(*a, top_k=2, backend="plain_only")).lower(x, logits, w_gate_up, w_down)
    assert len(probe.built) == 2
    jax.jit(lambda *a: moe_mlp(*a, top_k=2, activation="geglu", fuse=False)).lower(
        x, logits, w_gate_up, w_down
    )
    assert [p.op for p in seen] == ["grouped_matmul"] * 4


def test_serves_names_the_first_backend_asked():
    x = jax.ShapeDtypeStruct((48, 32), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((4, 32, 96), jnp.bfloat16)
    assert moe_module.serves("grouped_matmul_swiglu", x, w, "xla")
    assert not moe_module.serves("grouped_matmul_swiglu", x, w, "flydsl")


@pytest.mark.parametrize("activation", ["swiglu", "geglu"])
@pytest.mark.parametrize("tokens, experts, top_k", [(1, 8, 2), (37, 8, 2), (96, 16, 4)])
def test_fused_and_unfused_layers_agree_with_the_reference(tokens, experts, top_k, activation):
    x, logits, w_gate_up, w_down = _inputs(tokens, 32, 48, experts, seed=tokens + 1)
    fused = routed(x, logits, w_gate_up, w_down, top_k=top_k, activation=activation)
    unfused = moe_mlp(x, logits, w_gate_up, w_down, top_k=top_k, activation=activation, fuse=False)
    expected = reference(x, logits, w_gate_up, w_down, top_k=top_k, activation=activation)
    np.testing.assert_allclose(fused, expected, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(unfused, expected, rtol=2e-5, atol=2e-5)


def test_bf16_fused_layer_is_within_bf16_rounding_of_the_unfused_layer():
    x, logits, w_gate_up, w_down = _inputs(64, 64, 96, 8, seed=9, dtype=jnp.bfloat16)
    fused = moe_mlp(x, logits, w_gate_up, w_down, top_k=2)
    unfused = moe_mlp(x, logits, w_gate_up, w_down, top_k=2, fuse=False)
    assert fused.dtype == unfused.dtype == jnp.bfloat16
    assert _rel_l2(fused.astype(jnp.float32), unfused.astype(jnp.float32)) < 2e-2


def test_bad_arguments_raise_one_typed_error_naming_the_values():
    x, logits, w_gate_up, w_down = _inputs(8, 32, 48, 4)
    with pytest.raises(ConfigInvalid, match=r"top_k=5 must be an integer in \[1, E=4\]"):
        moe_mlp(x, logits, w_gate_up, w_down, top_k=5)
    with pytest.raises(ConfigInvalid, match="router_logits must be"):
        moe_mlp(x, logits[:4], w_gate_up, w_down, top_k=2)
    with pytest.raises(ConfigInvalid, match="w_down must be"):
        moe_mlp(x, logits, w_gate_up, w_down[:, :40], top_k=2)
    with pytest.raises(Unsupported, match="activation='relu'"):
        moe_mlp(x, logits, w_gate_up, w_down, top_k=2, activation="relu")


@pytest.mark.parametrize("fuse", [True, False])
def test_moe_mlp_sorted_ignores_the_rows_a_producer_left_past_t_times_k(fuse):
    """routed rows handed in already gathered, with 62 rows of NaN past them (the padding a decode tile
    wants): the same layer as moe_mlp, and the GEMMs keep the key of M = T*k."""
    from moetune.kernels.moe.layer import _permute, moe_mlp_sorted, route_rows

    x, logits, w_gate_up, w_down = _inputs(1, 64, 96, 8)
    routing, rows = route_rows(logits, 2, True)
    permuted = jnp.concatenate([_permute(x, rows), jnp.full((62, 64), jnp.nan, x.dtype)])
    got = moe_mlp_sorted(permuted, routing, rows, w_gate_up, w_down, fuse=fuse)
    want = moe_mlp(x, logits, w_gate_up, w_down, top_k=2, fuse=fuse)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
    with pytest.raises(ConfigInvalid, match=r"permuted \(1, 64\) must hold the 2 sorted rows"):
        moe_mlp_sorted(permuted[:1], routing, rows, w_gate_up, w_down)


def test_grouped_matmul_rows_names_m_when_lhs_carries_rows_past_it(monkeypatch):
    from moetune.kernels import api

    x, _, w, _ = _inputs(5, 64, 48, 4)
    sizes = jnp.array([2, 0, 3, 0], jnp.int32)
    padded = jnp.concatenate([x, jnp.full((11, 64), jnp.nan, x.dtype)])
    keys = []
    dispatch = api._dispatch
    monkeypatch.setattr(
        api, "_dispatch", lambda problem, **kw: keys.append(problem.m) or dispatch(problem, **kw)
    )
    got = api.grouped_matmul(padded, w, sizes, rows=5)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(api.grouped_matmul(x, w, sizes)))
    assert got.shape == (5, 96) and keys == [5, 5]
    with pytest.raises(ValueError, match="rows=17 must be between 1 and the 16 rows"):
        api.grouped_matmul(padded, w, sizes, rows=17)
