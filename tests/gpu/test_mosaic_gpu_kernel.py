"""The mosaic_gpu kernel on a Hopper GPU against jax.lax.ragged_dot in float32.

Covers random shapes, empty experts, rows past sum(group_sizes), M below the CTA tile, every row in one
expert, both weight layouts, float16, split-K and configs drawn from every part of the search space.
Outputs are checked for NaN (a poisoned allocation freed just before the call makes unwritten rows show).
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

jax = pytest.importorskip("jax")
jnp = jax.numpy

from moetune.kernels import registry  # noqa: E402
from moetune.kernels.backends.mosaic_gpu import space  # noqa: E402
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig  # noqa: E402
from moetune.kernels.device import current_fingerprint  # noqa: E402
from moetune.kernels.problem import Problem  # noqa: E402
from moetune.kernels.reference import reference_grouped_matmul, relative_error, tolerance  # noqa: E402

WS_N = MosaicGpuConfig(block_m=128, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="n")
WS_M = MosaicGpuConfig(block_m=64, block_n=128, block_k=64, max_concurrent_steps=3, wg_split="m")
WS_ONE = MosaicGpuConfig(
    block_m=64, block_n=128, block_k=128, max_concurrent_steps=2, wg_split="none", persistent=False
)
PLAIN = MosaicGpuConfig(
    block_m=64, block_n=64, block_k=32, max_concurrent_steps=4, warp_specialized=False, wg_split="none"
)
PLAIN_WIDE = MosaicGpuConfig(
    block_m=128,
    block_n=128,
    block_k=64,
    max_concurrent_steps=3,
    warp_specialized=False,
    wg_split="none",
    epi_tile_m=128,
    epi_tile_n=128,
    grid_minor_dim="n",
    grid_tile_width=4,
)
SPLIT_K = MosaicGpuConfig(
    block_m=64, block_n=64, block_k=64, max_concurrent_steps=3, wg_split="n", split_k=2, epi_tile_n=64
)
# One expert's tiles after another, in strips of 4 of its row tiles (chained: 4 k-steps of 4 stages at K=256).
WS_EXPERT = dataclasses.replace(WS_N, grid_minor_dim="expert", grid_tile_width=4)
CONFIGS = {
    "ws_n": WS_N,
    "ws_m": WS_M,
    "ws_one": WS_ONE,
    "plain": PLAIN,
    "plain_wide": PLAIN_WIDE,
    "ws_expert": WS_EXPERT,
}


def _backend():
    return registry.get("mosaic_gpu")


def _poison_allocator(shape, dtype) -> None:
    # Free a NaN buffer of the output's size so that the allocator is likely to hand it to the kernel.
    jax.block_until_ready(jnp.full(shape, jnp.nan, dtype)).delete()


def _run(config, m, k, n, sizes, *, transpose=False, dtype=jnp.bfloat16, seed=0):
    g = len(sizes)
    problem = Problem(
        "grouped_matmul",
        m=m,
        k=k,
        n=n,
        g=g,
        lhs_dtype=dtype,
        rhs_dtype=dtype,
        out_dtype=dtype,
        transpose_rhs=transpose,
    )
    fn = jax.jit(_backend().build(problem, config))
    key_l, key_r = jax.random.split(jax.random.key(seed))
    lhs = jax.random.normal(key_l, (m, k), dtype)
    rhs = (jax.random.normal(key_r, (g, n, k) if transpose else (g, k, n), dtype) * 0.1).astype(dtype)
    group_sizes = jnp.asarray(sizes, jnp.int32)
    _poison_allocator((m, n), dtype)
    out = np.asarray(fn(lhs, rhs, group_sizes).astype(jnp.float32))
    ref = np.asarray(reference_grouped_matmul(lhs, rhs, group_sizes, transpose_rhs=transpose))
    assert out.shape == (m, n)
    assert np.isfinite(out).all(), "NaN/inf in the output: some rows were not written"
    err = relative_error(out, ref)
    assert err < tolerance(dtype), f"relative error {err:.3e} for {config} m={m} sizes={sizes}"
    total = min(sum(sizes), m)
    assert not out[total:].any(), "rows past sum(group_sizes) must be zero"
    return out


def _random_sizes(rng: random.Random, m: int, g: int, empty: int) -> list[int]:
    total = rng.randint(max(1, m // 2), m)
    live = sorted(rng.sample(range(g), g - empty))
    cuts = sorted(rng.randint(0, total) for _ in range(len(live) - 1))
    parts = [b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True)]
    sizes = [0] * g
    for expert, size in zip(live, parts, strict=True):
        sizes[expert] = size
    return sizes


@pytest.mark.parametrize(
    "name, transpose",
    [
        ("ws_n", False),
        ("ws_n", True),
        ("ws_m", False),
        ("ws_m", True),
        ("plain", False),
        ("plain", True),
        ("ws_one", True),
        ("plain_wide", False),
        ("ws_expert", False),
        ("ws_expert", True),
    ],
)
def test_random_shapes(name, transpose):
    seed = 2 * sorted(CONFIGS).index(name) + transpose
    rng = random.Random(seed)
    m = rng.choice([8, 40, 136, 520, 1000])
    g = rng.choice([3, 8])
    sizes = _random_sizes(rng, m, g, empty=rng.randint(0, g - 2))
    _run(CONFIGS[name], m, 256, 512, sizes, transpose=transpose, seed=seed)


@pytest.mark.parametrize("config", [PLAIN, WS_M, SPLIT_K], ids=["plain", "ws_m", "split_k"])
def test_pad_lhs_at_small_m(config):
    # The lhs is padded to the last window's end: rows of no group, rows past sum(group_sizes), and an
    # expert whose window starts past row 0 must come out as without the padding.
    config = dataclasses.replace(config, pad_lhs=True)
    for m, sizes in ((2, [0, 1, 0, 1]), (3, [1, 0, 1, 0]), (40, [0, 13, 0, 20])):
        _run(config, m, 256, 256, sizes)


@pytest.mark.parametrize("name", ["ws_n", "ws_m", "plain", "ws_expert"])
def test_edge_routings(name):
    config = CONFIGS[name]
    # One shape, so that these share one compiled kernel.
    routings = [
        [0, 0, 200, 0, 0, 0],  # every row in one expert, in the middle
        [0, 37, 0, 1, 90, 0],  # empty experts between ragged ones; rows past sum(group_sizes)
        [0, 0, 0, 0, 0, 0],  # every expert empty: all zeros
        [60, 70, 0, 0, 90, 0],  # sum(group_sizes) > M: rows past M are dropped, as ragged_dot does
    ]
    for sizes in routings:
        _run(config, 200, 128, 256, sizes)
    # M far below the CTA tile, one row per expert.
    _run(config, 3, 128, 256, [1, 0, 1, 1])


def test_float16_and_split_k():
    _run(WS_N, 256, 256, 512, [100, 0, 156, 0], dtype=jnp.float16)
    _run(SPLIT_K, 48, 512, 256, [10, 0, 20, 17])
    _run(SPLIT_K, 48, 512, 256, [10, 0, 20, 17], transpose=True)


def test_configs_sampled_from_the_space():
    """Configs drawn from the whole pruned space, checked on a small Mixtral-like problem."""
    problem = Problem("grouped_matmul", m=96, k=512, n=512, g=8)
    device = current_fingerprint()
    valid, _ = space.space(problem, device).enumerate(problem, device)
    rng = random.Random(7)
    for config in rng.sample(valid, 4):
        sizes = _random_sizes(rng, 96, 8, empty=2)
        _run(config, 96, 512, 512, sizes, transpose=rng.random() < 0.5)


def test_heuristic_config_builds_and_runs():
    device = current_fingerprint()
    for m in (2, 2048):
        problem = Problem("grouped_matmul", m=m, k=1024, n=2048, g=8)
        config = _backend().heuristic(problem, device)
        sizes = [m // 8] * 8
        sizes[0] += m - sum(sizes)
        _run(config, m, 1024, 2048, sizes)


def test_cupti_timer_returns_ten_positive_samples():
    problem = Problem("grouped_matmul", m=256, k=512, n=1024, g=4)
    # Jitted, as the tuner hands the timer a compiled kernel: build() returns the plain kernel function,
    # which would trace and compile the Pallas kernel again on each of the ~200 timed calls.
    fn = jax.jit(_backend().build(problem, WS_N))
    lhs = jax.random.normal(jax.random.key(0), (256, 512), jnp.bfloat16)
    rhs = jax.random.normal(jax.random.key(1), (4, 512, 1024), jnp.bfloat16)
    sizes = jnp.asarray([64, 64, 64, 64], jnp.int32)
    # 5 MB of inputs: the timer replicates them past twice the L2 before timing.
    samples = _backend().timer().time(fn, [(lhs, rhs, sizes)], runs=10)
    assert len(samples) >= 10
    assert all(0 < s < 1 for s in samples)


@pytest.mark.parametrize("name", ["ws_n", "ws_m", "plain", "ws_expert"])
def test_a_local_slice_of_experts_from_row_start(name):
    # Expert parallelism's local slice: the groups start at row_start, every other row is zero. Walk
    # configs run on the row-tile table here (its leading zero group holds the rows before the slice).
    m, k, n, sizes = 520, 256, 512, [0, 37, 0, 90, 5, 0]
    problem = Problem("grouped_matmul", m=m, k=k, n=n, g=len(sizes))
    fn = jax.jit(_backend().build(problem, CONFIGS[name]))
    key_l, key_r = jax.random.split(jax.random.key(7))
    lhs = jax.random.normal(key_l, (m, k), jnp.bfloat16)
    rhs = (jax.random.normal(key_r, (len(sizes), k, n), jnp.bfloat16) * 0.1).astype(jnp.bfloat16)
    group_sizes = jnp.asarray(sizes, jnp.int32)
    for start in (0, 13, 200, 500):  # 500: the slice is cut at M
        _poison_allocator((m, n), jnp.bfloat16)
        out = np.asarray(fn(lhs, rhs, group_sizes, row_start=jnp.int32(start)).astype(jnp.float32))
        end = min(start + sum(sizes), m)
        local = np.diff(np.minimum(np.cumsum([0, *sizes]), end - start))
        ref = np.asarray(reference_grouped_matmul(lhs[start:end], rhs, jnp.asarray(local, jnp.int32)))
        assert np.isfinite(out).all(), "NaN/inf in the output: some rows were not written"
        err = relative_error(out[start:end], ref)
        assert err < tolerance(jnp.bfloat16), f"relative error {err:.3e} for {name} row_start={start}"
        assert not out[:start].any() and not out[end:].any(), "rows outside the slice must be zero"
