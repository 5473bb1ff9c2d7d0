"""The plug-in's patch of MaxText's MoE module: what install() replaces and puts back, when it refuses a
MaxText it does not know, the settings it refuses, and its stand-ins' results against jax.lax.ragged_dot."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.requires import require

require("maxtext", extra="maxtext")

from maxtext.layers import moe  # noqa: E402

from moetune.integrations import maxtext as plugin  # noqa: E402
from moetune.integrations.maxtext import hook  # noqa: E402
from moetune.kernels import recording  # noqa: E402


@pytest.fixture(autouse=True)
def not_installed():
    plugin.uninstall()
    yield
    plugin.uninstall()


def test_install_replaces_the_two_gemm_routes_and_uninstall_puts_maxtexts_back():
    mblx, tokamax, jax_module, call = moe.mblx, moe.tokamax, moe.jax, moe.RoutedMoE.__call__
    plugin.install()
    plugin.install()  # idempotent
    assert plugin.is_installed()
    assert moe.mblx.gmm is hook._megablox_gmm and moe.tokamax.ragged_dot is hook._tokamax_ragged_dot
    assert moe.jax.lax.ragged_dot is hook._lax_ragged_dot
    # Everything else the module reaches through those names is the real thing.
    assert moe.tokamax.RaggedDotGroupSizes is tokamax.RaggedDotGroupSizes
    assert moe.jax.lax.ragged_all_to_all is jax.lax.ragged_all_to_all and moe.jax.shard_map is jax.shard_map
    assert moe.jax.numpy is jax.numpy and moe.RoutedMoE.__call__ is not call
    plugin.uninstall()
    assert (moe.mblx, moe.tokamax, moe.jax, moe.RoutedMoE.__call__) == (mblx, tokamax, jax_module, call)
    assert not plugin.is_installed()


def test_installed_restores_only_what_it_installed():
    with plugin.installed():
        assert plugin.is_installed()
    assert not plugin.is_installed()
    plugin.install()
    with plugin.installed():
        pass
    assert plugin.is_installed()  # installed before the block: stays


def test_deepseeks_batch_split_moe_is_refused_not_run_on_maxtexts_kernels():
    from maxtext.models import deepseek_batchsplit

    plugin.install()
    with pytest.raises(plugin.MaxTextConfigUnsupported, match="use_batch_split_schedule"):
        deepseek_batchsplit.megablox.gmm(jnp.zeros((8, 4)), jnp.zeros((2, 4, 4)), jnp.array([4, 4]))


def test_an_unknown_megablox_gmm_is_not_recognised_and_nothing_is_patched(monkeypatch):
    def gmm(lhs, rhs, group_sizes, preferred_element_type, tiling, new_flag=False):
        raise AssertionError("never called")

    monkeypatch.setattr(moe, "mblx", types.SimpleNamespace(gmm=gmm))
    with pytest.raises(plugin.MaxTextNotRecognized, match="megablox's gmm takes other parameters"):
        plugin.install()
    assert not plugin.is_installed() and moe.mblx.gmm is gmm


def test_a_sparse_matmul_without_the_known_calls_is_not_recognised(monkeypatch):
    def sparse_matmul(self, *args):
        return jax.lax.ragged_dot(*args)

    monkeypatch.setattr(moe.RoutedMoE, "sparse_matmul", sparse_matmul)
    with pytest.raises(plugin.MaxTextNotRecognized, match=r"makes no mblx.gmm\(, tokamax.ragged_dot\( call"):
        plugin.install()
    assert not plugin.is_installed()


def _config(**changes):
    defaults = dict(
        quantization="", use_batch_split_schedule=False, te_moe_block=False, attention="dot_product",
        sparse_matmul=True, megablox=True, use_tokamax_gmm=False, use_gmm_v2=False, num_moe_emb_chunks=0,
    )  # fmt: skip
    return types.SimpleNamespace(**(defaults | changes))


@pytest.mark.parametrize(
    "changes, named",
    [
        (dict(quantization="fp8"), "quantization='fp8'"),
        (dict(use_batch_split_schedule=True), "use_batch_split_schedule=True"),
        (dict(te_moe_block=True), "te_moe_block=True"),
        (dict(attention="vllm_rpa"), "attention='vllm_rpa'"),
        (dict(sparse_matmul=False), "sparse_matmul=False"),
        (dict(use_gmm_v2=True), "use_gmm_v2=True"),
        (dict(num_moe_emb_chunks=2), "num_moe_emb_chunks=2"),
    ],
)
def test_each_setting_the_plugin_cannot_serve_is_refused_by_name(changes, named):
    with pytest.raises(plugin.MaxTextConfigUnsupported) as refused:
        hook.check_config(_config(**changes))
    assert named in str(refused.value) and "\n" not in str(refused.value)


def test_the_served_routes_pass_the_check():
    hook.check_config(_config())
    hook.check_config(_config(megablox=False, use_tokamax_gmm=True))
    hook.check_config(_config(megablox=False))  # jax.lax.ragged_dot, MaxText's GPU configs'


def test_a_module_calling_ragged_dot_outside_gmm_is_not_recognised(monkeypatch):
    import inspect

    read = inspect.getsource
    source = read(moe) + "\nx = jax.lax.ragged_dot(a, b, c)\n"
    monkeypatch.setattr(inspect, "getsource", lambda obj: source if obj is moe else read(obj))
    with pytest.raises(plugin.MaxTextNotRecognized, match="jax.lax.ragged_dot in 2 places"):
        hook._recognise(moe)


def _operands(m=40, k=16, n=24, g=6, seed=0):
    keys = jax.random.split(jax.random.key(seed), 2)
    lhs = jax.random.normal(keys[0], (m, k), jnp.float32)
    rhs = jax.random.normal(keys[1], (g, k, n), jnp.float32)
    return lhs, rhs


def test_the_megablox_stand_in_is_ragged_dot_with_empty_groups_and_rows_past_the_groups():
    lhs, rhs = _operands()
    sizes = jnp.array([7, 0, 12, 3, 0, 10], jnp.int32)  # 32 of 40 rows
    with recording() as dispatched:
        out = hook._megablox_gmm(lhs, rhs, sizes, jnp.float32, tiling=(128,) * 9, interpret=True)
    want = jax.lax.ragged_dot(lhs, rhs, sizes, preferred_element_type=jnp.float32)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert not np.any(np.asarray(out[32:])) and dispatched[0].problem.m == 40


def test_the_megablox_stand_in_serves_a_local_slice_of_experts_at_group_offset():
    lhs, rhs = _operands(g=3)
    sizes = jnp.array([5, 9, 4, 8, 6, 8], jnp.int32)  # six experts, rhs holds experts 2..4
    out = hook._megablox_gmm(lhs, rhs, sizes, jnp.float32, group_offset=jnp.array([2], jnp.int32))
    # The slice's meaning: every other expert's rows come out zero, as with zero weights for them.
    whole = jnp.zeros((6, *rhs.shape[1:]), rhs.dtype).at[2:5].set(rhs)
    want = jax.lax.ragged_dot(lhs, whole, sizes, preferred_element_type=jnp.float32)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert (
        np.any(np.asarray(out[14:32]))
        and not np.any(np.asarray(out[:14]))
        and not np.any(np.asarray(out[32:]))
    )


@pytest.mark.parametrize(
    "flag", ["lhs_quantize_dtype", "rhs_quantize_dtype", "use_qwix_quantization", "use_gmm_v2", "partial_sum"]
)
def test_the_megablox_stand_in_refuses_what_it_would_otherwise_drop(flag):
    lhs, rhs = _operands()
    value = jnp.zeros((40, 24)) if flag == "partial_sum" else (True if "use" in flag else jnp.int8)
    with pytest.raises(plugin.MaxTextConfigUnsupported, match=flag):
        hook._megablox_gmm(lhs, rhs, jnp.full((6,), 5, jnp.int32), **{flag: value})


def test_the_lax_stand_in_is_ragged_dot():
    lhs, rhs = _operands()
    sizes = jnp.array([10, 0, 5, 5, 10, 2], jnp.int32)
    out = hook._lax_ragged_dot(lhs=lhs, rhs=rhs, group_sizes=sizes, preferred_element_type=jnp.float32)
    want = jax.lax.ragged_dot(lhs, rhs, sizes, preferred_element_type=jnp.float32)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_the_tokamax_stand_in_takes_tokamaxs_group_sizes():
    import tokamax

    lhs, rhs = _operands()
    sizes = jnp.array([10, 0, 5, 5, 10, 10], jnp.int32)
    out = hook._tokamax_ragged_dot(
        lhs=lhs, rhs=rhs, group_sizes=tokamax.RaggedDotGroupSizes(sizes, 40),
        precision=jax.lax.Precision.DEFAULT, preferred_element_type=jnp.float32, implementation="mosaic",
        group_offset=None,
    )  # fmt: skip
    want = jax.lax.ragged_dot(lhs, rhs, sizes, preferred_element_type=jnp.float32)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
