"""The fused decode block (two Pallas Triton kernels) on a CPU: Pallas's interpreter against the float32
reference on small shapes, its edge cases, its config checks, and its lowering to Triton for an H200."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.moe import decode_block as db
from moetune.kernels.moe.reference import moe_mlp_reference

SMALL = db.DecodeConfig(block_f=16, block_k=16, block_h=16, block_fd=16)


def _inputs(tokens, experts, hidden, inter, seed=0):
    ks = jax.random.split(jax.random.key(seed), 4)
    x = jax.random.normal(ks[0], (tokens, hidden), jnp.float32)
    logits = jax.random.normal(ks[1], (tokens, experts), jnp.float32)
    w_gate_up = jax.random.normal(ks[2], (experts, hidden, 2 * inter), jnp.float32) / np.sqrt(hidden)
    w_down = jax.random.normal(ks[3], (experts, inter, hidden), jnp.float32) / np.sqrt(inter)
    return x, logits, w_gate_up, w_down


def _check(x, logits, w_gate_up, w_down, top_k, renormalize=True, config=SMALL):
    out = db.decode_block(
        x, logits, w_gate_up, w_down, top_k=top_k, renormalize=renormalize, config=config, interpret=True
    )
    want = moe_mlp_reference(x, logits, w_gate_up, w_down, top_k=top_k, renormalize=renormalize)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-4, atol=1e-5)
    return out


@pytest.mark.parametrize(
    "tokens, experts, top_k, renormalize, split, up_split, up_programs, by_rank",
    [
        (1, 8, 2, True, 1, 1, 0, False),
        (3, 8, 2, False, 1, 2, 0, False),
        (5, 16, 4, True, 3, 1, 0, False),
        (2, 4, 1, True, 2, 2, 0, False),
        (1, 8, 3, True, 2, 2, 0, False),
        # Fewer programs than (slot, F tile) items: shares cross slots and F tiles mid-list.
        (3, 8, 2, False, 1, 1, 3, False),
        (5, 16, 4, True, 3, 1, 7, False),
        # More programs than items: the ones past the list stream nothing.
        (1, 8, 3, True, 2, 1, 64, False),
        # Shares of (slot, F tile, K split) units: float32 partials, a unit's splits on two programs.
        (3, 8, 2, False, 1, 2, 3, False),
        (1, 8, 3, True, 2, 2, 5, False),
        # Top-k by rank, with a program per item and with shares, renormalized or not.
        (1, 8, 2, True, 1, 1, 0, True),
        (5, 16, 4, False, 3, 1, 7, True),
        (3, 8, 2, True, 1, 2, 3, True),
    ],
)
def test_interpreted_block_equals_the_reference(
    tokens, experts, top_k, renormalize, split, up_split, up_programs, by_rank
):
    config = db.DecodeConfig(
        block_f=16, block_k=16, block_h=16, block_fd=16, down_split=split, up_split=up_split,
        up_programs=up_programs, route_by_rank=by_rank,
    )  # fmt: skip
    _check(*_inputs(tokens, experts, 32, 32), top_k, renormalize, config)


@pytest.mark.parametrize(
    "tokens, warps, by_rank, up_programs, renormalize",
    [(1, 4, False, 0, True), (3, 8, True, 0, False), (2, 16, False, 3, False), (1, 8, True, 5, True)],
)
def test_routing_on_a_row_per_warp_gives_the_same_block(tokens, warps, by_rank, up_programs, renormalize):
    # The padding rows route -inf logits (NaN weights without renormalizing): whatever they pick,
    # nothing of theirs reaches a real row.
    config = db.DecodeConfig(
        block_f=16, block_k=16, block_h=16, block_fd=16, warps_up=warps, route_by_rank=by_rank,
        route_warp_rows=True, up_programs=up_programs,
    )  # fmt: skip
    assert db.routing_rows(tokens, config) == warps
    _check(*_inputs(tokens, 16, 32, 32, seed=warps), 4, renormalize, config)


def test_a_share_of_many_slots_picks_each_step_s_expert_among_them():
    # One F tile per expert (block_f = F) and three programs over up to 16 touched experts: a share
    # spans up to 7 slots, found before the loop, its last ones past the touched count when few are.
    config = db.DecodeConfig(block_f=32, block_k=16, block_h=16, block_fd=16, up_programs=3)
    assert db.slots_per_share(16, 1, 3) == 7
    for tokens, top_k in ((5, 4), (1, 2)):
        _check(*_inputs(tokens, 16, 32, 32, seed=tokens), top_k, True, config)


@pytest.mark.parametrize("up_split, up_programs", [(1, 0), (2, 0), (1, 5)])
def test_k_major_weights_give_the_same_block(up_split, up_programs):
    x, logits, w_gate_up, w_down = _inputs(3, 8, 32, 16, seed=4)
    config = db.DecodeConfig(
        block_f=16, block_k=16, block_h=16, block_fd=16, up_split=up_split, up_programs=up_programs
    )
    out = db.decode_block(
        x, logits, w_gate_up.transpose(0, 2, 1), w_down.transpose(0, 2, 1), top_k=2, config=config,
        transpose_weights=True, interpret=True,
    )  # fmt: skip
    want = moe_mlp_reference(x, logits, w_gate_up, w_down, top_k=2)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "up_split, up_programs, down_split, k_major, swap_ab",
    [
        (1, 0, 1, False, False), (2, 3, 1, False, False),
        pytest.param(2, 0, 2, True, False, marks=pytest.mark.slow),
        pytest.param(1, 3, 2, True, False, marks=pytest.mark.slow),
        # Each step's dot as w^T @ x^T, transposed back (swap_ab_up, swap_ab_down).
        (2, 3, 2, True, True),
        pytest.param(1, 0, 2, False, True, marks=pytest.mark.slow),
    ],
)  # fmt: skip
def test_tiles_past_a_dim_s_end_load_zeros_and_store_nothing(
    up_split, up_programs, down_split, k_major, swap_ab
):
    # H=80 and F=48 under 32- and 64-wide tiles: every dim's last tile runs past its end; two K splits
    # over three steps leave the second one step (and with shares one step past H, all masked).
    config = db.DecodeConfig(
        block_f=32, block_k=32, block_h=64, block_fd=32, up_split=up_split, up_programs=up_programs,
        down_split=down_split, swap_ab_up=swap_ab, swap_ab_down=swap_ab,
    )  # fmt: skip
    x, logits, w_gate_up, w_down = _inputs(3, 8, 80, 48, seed=7)
    weights = (w_gate_up.transpose(0, 2, 1), w_down.transpose(0, 2, 1)) if k_major else (w_gate_up, w_down)
    out = db.decode_block(
        x, logits, *weights, top_k=2, config=config, transpose_weights=k_major, interpret=True
    )
    want = moe_mlp_reference(x, logits, w_gate_up, w_down, top_k=2)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-4, atol=1e-5)


def test_one_expert_takes_every_token_and_the_others_none():
    x, logits, w_gate_up, w_down = _inputs(3, 8, 32, 16, seed=1)
    logits = logits.at[:, 5].set(10.0)  # every token's first choice; most experts get no token
    _check(x, logits, w_gate_up, w_down, 1)
    _check(x, logits, w_gate_up, w_down, 2, config=db.DecodeConfig(16, 16, 1, 4, 16, 16, 1, 4, 4))
    _check(x, logits, w_gate_up, w_down, 2, config=db.DecodeConfig(16, 16, 1, 4, 16, 16, 1, 4, 1, 1, 3))


def test_nan_in_x_shows_in_its_token_only():
    x, logits, w_gate_up, w_down = _inputs(2, 8, 32, 16, seed=2)
    out = db.decode_block(
        x.at[1, 3].set(jnp.nan), logits, w_gate_up, w_down, top_k=2, config=SMALL, interpret=True
    )
    assert np.isnan(np.asarray(out[1])).all() and not np.isnan(np.asarray(out[0])).any()


@pytest.mark.parametrize("up_programs", [0, 2])
def test_group_offset_sums_the_local_experts_only(up_programs):
    x, logits, w_gate_up, w_down = _inputs(3, 8, 32, 16, seed=3)
    offset = jnp.array([4], jnp.int32)
    config = dataclasses.replace(SMALL, up_programs=up_programs)
    out = db.decode_block(
        x, logits, w_gate_up[4:], w_down[4:], top_k=2, group_offset=offset, config=config, interpret=True
    )
    # The whole layer with the other shard's experts zeroed is the local shard's share.
    zero = jnp.zeros_like
    want = moe_mlp_reference(
        x, logits, w_gate_up.at[:4].set(zero(w_gate_up[:4])), w_down.at[:4].set(zero(w_down[:4])), top_k=2
    )
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-4, atol=1e-5)


def test_bounds_and_configs_are_checked_by_name():
    assert db.fits(32, 128, 8, 2048, 768, db.DecodeConfig())
    assert db.unfit_reason(33, 128, 8, 2048, 768, db.DecodeConfig()) == "T=33 > 32"
    assert "T*top_k" in db.unfit_reason(32, 512, 16, 2048, 512, db.DecodeConfig())
    assert db.unfit_reason(1, 8, 2, 64, 40, db.DecodeConfig()) == "F=40 is not a multiple of 16"
    assert db.fits(1, 8, 2, 2880, 2880, db.DecodeConfig(block_f=128, block_k=256, block_h=256, block_fd=256))
    with pytest.raises(ConfigInvalid, match="block_f=24"):
        db.DecodeConfig(block_f=24)
    with pytest.raises(ConfigInvalid, match="down_split=0"):
        db.DecodeConfig(down_split=0)
    # Four K steps over three splits would leave the third none; 2880 = 22.5 steps of 128 shares well.
    assert "up_split=3 leaves a split no K step" in db.unfit_reason(
        1, 8, 2, 256, 128, db.DecodeConfig(block_k=64, up_split=3)
    )
    assert db.fits(1, 8, 2, 2880, 128, db.DecodeConfig(block_k=128, up_split=4))
    with pytest.raises(ConfigInvalid, match="up_programs=-1"):
        db.DecodeConfig(up_programs=-1)
    # One program streaming all 320 slots of Qwen3-Next at T=32 would find them all before its loop.
    assert "320 work slots" in db.unfit_reason(32, 512, 10, 2048, 512, db.DecodeConfig(up_programs=1))
    assert db.fits(32, 512, 10, 2048, 512, db.DecodeConfig(up_programs=128))
    by_rank = db.DecodeConfig(route_by_rank=True)
    assert db.fits(1, 512, 10, 2048, 512, by_rank) and db.fits(8, 512, 8, 2048, 512, by_rank)
    assert "route_by_rank takes T*E <= 4096" in db.unfit_reason(9, 512, 8, 2048, 512, by_rank)
    # Padded to a row per warp, the routing's rows count: 16 of them over 512 experts is too many.
    padded = dataclasses.replace(by_rank, route_warp_rows=True, warps_up=16)
    assert db.routing_rows(1, padded) == 16 and db.routing_rows(32, padded) == 32
    assert "16 routed rows" in db.unfit_reason(1, 512, 10, 2048, 512, padded)
    assert db.fits(1, 256, 8, 2048, 512, padded)
    with pytest.raises(ConfigInvalid, match="decode block"):
        db.decode_block(*_inputs(1, 8, 32, 24), top_k=2, config=SMALL, interpret=True)


def test_kernels_lower_to_two_triton_calls_for_an_h200(triton_lowering_for_h200):
    s = jax.ShapeDtypeStruct
    for tokens, experts, top_k, split, k_major, programs, by_rank, warp_rows in (
        (1, 128, 8, 1, False, 0, True, False),
        (5, 512, 10, 4, True, 0, False, False),
        (32, 512, 10, 1, False, 264, False, False),
        (1, 512, 10, 1, False, 132, True, False),
        (1, 128, 8, 2, True, 128, False, False),
        (1, 128, 8, 1, False, 0, False, True),
        (2, 128, 8, 1, False, 0, True, True),
    ):
        config = db.DecodeConfig(
            down_split=split, up_split=split, up_programs=programs, route_by_rank=by_rank,
            route_warp_rows=warp_rows,
        )  # fmt: skip
        gate_up, down = (
            ((experts, 1024, 2048), (experts, 2048, 512))
            if k_major
            else ((experts, 2048, 1024), (experts, 512, 2048))
        )
        args = (
            s((tokens, 2048), jnp.bfloat16),
            s((tokens, experts), jnp.float32),
            s(gate_up, jnp.bfloat16),
            s(down, jnp.bfloat16),
        )
        block = jax.jit(
            lambda *a, config=config, top_k=top_k, k_major=k_major: db.decode_block(
                *a, top_k=top_k, config=config, transpose_weights=k_major
            )
        )
        text = block.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
        assert text.count("__gpu$xla.gpu.triton") == 2 and "moetune_decode_down" in text


def test_tiles_past_a_dim_s_end_lower_for_an_h200(triton_lowering_for_h200):
    # gpt-oss-120b's H = F = 2880 under 128- and 256-wide tiles (22.5 and 11.25 of them), 16-bit and
    # K-major FP8 with per-channel scales, a program per item and shares.
    s = jax.ShapeDtypeStruct
    tiles = dict(block_f=128, block_k=256, block_h=256, block_fd=128)
    for fp8, config in (
        (False, db.DecodeConfig(**tiles, up_split=2, down_split=2)),
        (True, db.DecodeConfig(**tiles, up_programs=132, widen_up="bits", widen_down="f16")),
        (True, db.DecodeConfig(**tiles, up_split=2, widen_down="f16", swap_ab_up=True, swap_ab_down=True)),
    ):
        weights = jnp.float8_e4m3fn if fp8 else jnp.bfloat16
        shapes = ((128, 5760, 2880), (128, 2880, 2880)) if fp8 else ((128, 2880, 5760), (128, 2880, 2880))
        args = [
            s((1, 2880), jnp.bfloat16),
            s((1, 128), jnp.float32),
            *(s(shape, weights) for shape in shapes),
        ]
        scales = dict(
            w_gate_up_scale=s((128, 5760, 1), jnp.float32), w_down_scale=s((128, 2880, 1), jnp.float32)
        )
        block = jax.jit(
            lambda *a, config=config, fp8=fp8, scales=scales: db.decode_block(
                *a[:4], top_k=4, config=config, transpose_weights=fp8,
                **(dict(zip(scales, a[4:], strict=True)) if fp8 else {}),
            )
        )  # fmt: skip
        text = (
            block.trace(*args, *(scales.values() if fp8 else ()))
            .lower(lowering_platforms=("cuda",))
            .as_text()
        )
        assert text.count("__gpu$xla.gpu.triton") == 2


def test_moe_mlp_chooses_the_block_by_mode_and_bound_and_says_why():
    from moetune.kernels.moe import layer

    x, logits, w_gate_up, w_down = _inputs(2, 8, 256, 128)
    choose = lambda **kw: layer.decode_choice(x, logits, w_gate_up, 2, **kw)  # noqa: E731
    assert choose().config is None and choose().reason == "not on a GPU"
    assert choose(decode_mode="interpret").interpret and choose(decode_mode="interpret").config is not None
    assert choose(decode_mode="xla").reason == "decode_mode='xla'"
    assert choose(decode_mode="interpret", fuse=False).config is None
    assert choose(decode_mode="interpret", activation="geglu").config is None
    with pytest.raises(ConfigInvalid, match="decode_mode"):
        choose(decode_mode="fast")
    big = jnp.zeros((40, 256), jnp.float32)
    assert (
        layer.decode_choice(big, jnp.zeros((40, 8)), w_gate_up, 2, decode_mode="interpret").reason
        == "T=40 > 32"
    )
    out = layer.moe_mlp(x, logits, w_gate_up, w_down, top_k=2, decode_mode="interpret")
    want = moe_mlp_reference(x, logits, w_gate_up, w_down, top_k=2)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-4, atol=1e-5)
    # Its backward is the unfused path's (under jit: one program to compile, not one per operation).
    grad = jax.jit(
        jax.grad(
            lambda x: layer.moe_mlp(x, logits, w_gate_up, w_down, top_k=2, decode_mode="interpret").sum()
        )
    )
    unfused = jax.jit(
        jax.grad(lambda x: layer.moe_mlp(x, logits, w_gate_up, w_down, top_k=2, decode_mode="xla").sum())
    )
    np.testing.assert_allclose(np.asarray(grad(x)), np.asarray(unfused(x)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("renormalize", [True, False])
def test_in_kernel_routing_is_lax_top_k_with_its_ties_and_signs(renormalize):
    # Ties (to the lower expert), negative and zero logits, -inf padding past E: as lax.top_k and the
    # softmax of moe.route.
    logits = jnp.array(
        [[0.5, -1.0, 0.5, 2.0, -0.0, 0.0, -3.0, 2.0], [-1.0, -2.0, -1.0, -0.5, -7.0, -1.0, -0.5, -9.0]],
        jnp.float32,
    )
    padded = jnp.pad(logits, ((0, 0), (0, 8)), constant_values=-jnp.inf)
    ids, weights, taken = db.route_in_kernel(padded, tokens=2, experts=8, top_k=3, renormalize=renormalize)
    values, want_ids = jax.lax.top_k(logits, 3)
    np.testing.assert_array_equal(np.asarray(ids[:, :3]), np.asarray(want_ids))
    scores = jax.nn.softmax(values if renormalize else logits, axis=-1)
    want = scores if renormalize else jnp.take_along_axis(scores, want_ids, axis=1)
    np.testing.assert_allclose(np.asarray(weights[:, :3]), np.asarray(want), rtol=1e-6)
    assert np.asarray(taken).sum() == 6 and not np.asarray(taken[:, 8:]).any()


@pytest.mark.parametrize("chunk", [1, 4, 16])
@pytest.mark.parametrize("renormalize", [True, False])
def test_routing_by_rank_gives_what_the_argmax_rounds_give(chunk, renormalize):
    # Ties across chunks, signed zeros, a padding token row (all -inf) and experts past E.
    logits = jnp.array(
        [[0.5, -1.0, 0.5, 2.0, -0.0, 0.0, -3.0, 2.0, 0.5, 2.0, -1.0, 7.0],
         [-1.0, -2.0, -1.0, -0.5, -7.0, -1.0, -0.5, -9.0, -0.5, -0.5, -2.0, -1.0]],
        jnp.float32,
    )  # fmt: skip
    padded = jnp.pad(logits, ((0, 2), (0, 4)), constant_values=-jnp.inf)
    load = lambda c: jax.lax.dynamic_slice_in_dim(padded, c * chunk, chunk, axis=1)  # noqa: E731
    ranks = db.rank_in_kernel(padded, load, experts=12, chunk=chunk)
    for top_k in (1, 3, 5):
        kwargs = dict(tokens=2, experts=12, top_k=top_k, renormalize=renormalize)
        want = db.route_in_kernel(padded, **kwargs)
        got = db.route_in_kernel(padded, ranks=ranks, **kwargs)
        for g, w in zip(got, want, strict=True):  # ids, weights and taken, bit for bit (NaN where NaN)
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


EXPERT_PARALLEL_BLOCK = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from moetune.kernels.moe import moe_mlp
from moetune.kernels.moe.reference import moe_mlp_reference

assert jax.device_count() == 4, jax.devices()
mesh = jax.make_mesh((4,), ("ep",))
T, E, LOCAL, H, F, K = 3, 8, 2, 64, 32, 2
ks = jax.random.split(jax.random.key(0), 4)
x = jax.random.normal(ks[0], (T, H), jnp.float32)
logits = jax.random.normal(ks[1], (T, E), jnp.float32)
w_gate_up = jax.random.normal(ks[2], (E, H, 2 * F), jnp.float32) / np.sqrt(H)
w_down = jax.random.normal(ks[3], (E, F, H), jnp.float32) / np.sqrt(F)


def sharded(x, w_gate_up, w_down):
    def body(x, logits, w_gate_up, w_down):
        offset = (jax.lax.axis_index("ep") * LOCAL).reshape(1)
        out = moe_mlp(x, logits, w_gate_up, w_down, top_k=K, group_offset=offset, decode_mode="interpret")
        return jax.lax.psum(out, "ep")

    specs = (P(), P(), P("ep"), P("ep"))
    return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P(), check_vma=False)(
        x, logits, w_gate_up, w_down
    )


def whole(x, w_gate_up, w_down):
    return moe_mlp_reference(x, logits, w_gate_up, w_down, top_k=K)


from moetune.kernels.moe.layer import decode_choice

assert decode_choice(x, logits, w_gate_up[:LOCAL], K, decode_mode="interpret", sliced=True).kernel is not None
put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))
args = (put(x, P()), put(w_gate_up, P("ep")), put(w_down, P("ep")))
np.testing.assert_allclose(jax.jit(sharded)(*args), whole(x, w_gate_up, w_down), rtol=1e-4, atol=1e-5)
loss = lambda f: lambda *a: (f(*a) ** 2).sum()
grads = jax.jit(jax.grad(loss(sharded), (0, 1, 2)))(*args)
for got, want in zip(grads, jax.grad(loss(whole), (0, 1, 2))(x, w_gate_up, w_down)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
print("expert parallel block ok")
"""


@pytest.mark.slow
def test_the_block_under_shard_map_and_grad_matches_the_whole_layer(tmp_path):
    """Experts split four ways by shard_map, each shard's block on its local slice (group_offset), the
    shards' sums added: the whole layer's output and gradients (the backward on the unfused path)."""
    from tests.kernels.test_kernels_subprocess import run_python

    output = run_python(EXPERT_PARALLEL_BLOCK, tmp_path, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    assert "expert parallel block ok" in output


@pytest.mark.parametrize("seed", range(4))
def test_a_share_spans_no_more_slots_than_the_kernel_finds_before_its_loop(seed):
    # Kernel 1 with up_programs splits count * slot_units units into contiguous shares of
    # ceil(units / programs); whatever the touched count, no share crosses more slots than the bound.
    rng = np.random.default_rng(seed)
    for _ in range(200):
        slots, slot_units, programs = (int(v) for v in rng.integers(1, [64, 24, 200]))
        bound = db.slots_per_share(slots, slot_units, programs)
        for count in range(1, slots + 1):
            units = count * slot_units
            share = -(-units // programs)
            spans = [
                (min(lo + share, units) - 1) // slot_units - lo // slot_units + 1
                for lo in range(0, units, share)
            ]
            assert max(spans) <= bound, (slots, slot_units, programs, count)
