"""The mosaic_gpu SwiGLU epilogue (op "grouped_matmul_swiglu") on a Hopper GPU against the float32
reference: silu(lhs @ gate) * (lhs @ up) from ragged_dot at full precision.

Covers random shapes, empty experts, rows past sum(group_sizes), M below the CTA tile, both weight
layouts, every pipeline, the heuristic at Mixtral-8x7B's gate_up shape, and configs drawn from the
space. Outputs are checked for NaN (a poisoned allocation freed just before the call makes unwritten
rows show).
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
from moetune.kernels.reference import reference_of, relative_error, tolerance  # noqa: E402

OP = "grouped_matmul_swiglu"
CONFIGS = {
    "ws_n": MosaicGpuConfig(block_m=128, block_n=64, block_k=64, max_concurrent_steps=3, wg_split="n"),
    "ws_m": MosaicGpuConfig(block_m=64, block_n=128, block_k=64, max_concurrent_steps=3, wg_split="m"),
    "ws_one": MosaicGpuConfig(
        block_m=64, block_n=128, block_k=64, max_concurrent_steps=2, wg_split="none", persistent=False
    ),
    "plain": MosaicGpuConfig(
        block_m=64, block_n=64, block_k=32, max_concurrent_steps=4, warp_specialized=False, wg_split="none"
    ),
    # One expert's tiles after another, in strips of 4 of its row tiles.
    "ws_expert": MosaicGpuConfig(
        block_m=128,
        block_n=64,
        block_k=64,
        max_concurrent_steps=4,
        grid_minor_dim="expert",
        grid_tile_width=4,
    ),
}


def _run(config, m, k, n, sizes, *, transpose=False, dtype=jnp.bfloat16, seed=0):
    """n is rhs's 2F columns; the output has F."""
    g = len(sizes)
    problem = Problem(
        OP, m=m, k=k, n=n, g=g, lhs_dtype=dtype, rhs_dtype=dtype, out_dtype=dtype, transpose_rhs=transpose
    )
    fn = jax.jit(registry.get("mosaic_gpu").build(problem, config))
    key_l, key_r = jax.random.split(jax.random.key(seed))
    lhs = jax.random.normal(key_l, (m, k), dtype)
    rhs = (jax.random.normal(key_r, (g, n, k) if transpose else (g, k, n), dtype) * k**-0.5).astype(dtype)
    group_sizes = jnp.asarray(sizes, jnp.int32)
    jax.block_until_ready(jnp.full((m, n // 2), jnp.nan, dtype)).delete()
    out = np.asarray(fn(lhs, rhs, group_sizes).astype(jnp.float32))
    ref = np.asarray(reference_of(problem)(lhs, rhs, group_sizes))
    assert out.shape == (m, n // 2)
    assert np.isfinite(out).all(), "NaN/inf in the output: some rows were not written"
    err = relative_error(out, ref)
    assert err < tolerance(dtype), f"relative error {err:.3e} for {config} m={m} sizes={sizes}"
    assert not out[min(sum(sizes), m) :].any(), "rows past sum(group_sizes) must be zero"


def _random_sizes(rng: random.Random, m: int, g: int, empty: int) -> list[int]:
    total = rng.randint(max(1, m // 2), m)
    live = sorted(rng.sample(range(g), g - empty))
    cuts = sorted(rng.randint(0, total) for _ in range(len(live) - 1))
    sizes = [0] * g
    for expert, a, b in zip(live, [0, *cuts], [*cuts, total], strict=True):
        sizes[expert] = b - a
    return sizes


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("transpose", [False, True])
def test_random_shapes(name, transpose):
    seed = 2 * sorted(CONFIGS).index(name) + transpose
    rng = random.Random(seed)
    m = rng.choice([8, 40, 136, 520, 1000])
    g = rng.choice([3, 8])
    _run(CONFIGS[name], m, 256, 1024, _random_sizes(rng, m, g, rng.randint(0, g - 2)), transpose=transpose)


@pytest.mark.parametrize("name", ["ws_n", "ws_m", "plain", "ws_expert"])
def test_edge_routings(name):
    config = CONFIGS[name]
    for sizes in (
        [0, 0, 200, 0, 0, 0],  # every row in one expert
        [0, 37, 0, 1, 90, 0],  # empty experts between ragged ones; rows past sum(group_sizes)
        [0, 0, 0, 0, 0, 0],  # every expert empty: all zeros
        [60, 70, 0, 0, 90, 0],  # sum(group_sizes) > M: rows past M are dropped
    ):
        _run(config, 200, 128, 512, sizes)
    _run(config, 3, 128, 512, [1, 0, 1, 1])  # M far below the CTA tile
    _run(config, 3, 128, 512, [1, 0, 1, 1], transpose=True)


@pytest.mark.parametrize("name", ["ws_m", "plain"])
def test_pad_lhs_at_small_m(name):
    config = dataclasses.replace(CONFIGS[name], pad_lhs=True)
    for m, sizes in ((2, [0, 1, 0, 1]), (3, [1, 0, 1, 0]), (40, [0, 13, 0, 20])):
        _run(config, m, 256, 512, sizes)


def test_float16():
    _run(CONFIGS["ws_n"], 256, 256, 512, [100, 0, 156, 0], dtype=jnp.float16)


@pytest.mark.parametrize("m", [16, 1024])
def test_heuristic_at_mixtral_gate_up(m):
    problem = Problem(OP, m=m, k=4096, n=28672, g=8)
    config = registry.get("mosaic_gpu").heuristic(problem, current_fingerprint())
    sizes = [m // 8] * 8
    sizes[3] = 0
    _run(config, m, 4096, 28672, sizes)


def test_configs_sampled_from_the_space():
    problem = Problem(OP, m=96, k=512, n=1024, g=8)
    device = current_fingerprint()
    valid, _ = space.space(problem, device).enumerate(problem, device)
    rng = random.Random(11)
    for config in rng.sample(valid, 4):
        _run(config, 96, 512, 1024, _random_sizes(rng, 96, 8, empty=2), transpose=rng.random() < 0.5)
