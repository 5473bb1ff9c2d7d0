"""The fine-grained paths of the mosaic_gpu kernel on a Hopper GPU against the float32 reference: the
row-tile table schedule and swap-AB tiles (block_m below 64), for the plain GEMM and the SwiGLU
epilogue, both weight layouts, 64-512 experts with few or no rows each, rows past sum(group_sizes), and
the heuristic's picks at the development models' expert counts (K and N cut so that the float32
reference fits) and at gpt-oss's widths, which rule out the wide tiles. An empty expert's weights are
NaN: a kernel that reads or multiplies them shows it.
"""

from __future__ import annotations

import functools
import random

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

jax = pytest.importorskip("jax")
jnp = jax.numpy

from moetune.kernels import registry  # noqa: E402
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig as C  # noqa: E402
from moetune.kernels.device import current_fingerprint  # noqa: E402
from moetune.kernels.problem import Problem  # noqa: E402
from moetune.kernels.reference import reference_of, relative_error, tolerance  # noqa: E402

TABLE = dict(tile_schedule="table")
CONFIGS = {
    "table_ws_n": C(block_m=64, block_n=64, block_k=64, max_concurrent_steps=4, wg_split="n", **TABLE),
    "table_plain_np": C(
        block_m=64, block_n=64, block_k=64, max_concurrent_steps=3, warp_specialized=False, wg_split="none",
        persistent=False, **TABLE,
    ),
    "table_expert": C(
        block_m=128, block_n=64, block_k=64, max_concurrent_steps=4, grid_minor_dim="expert",
        grid_tile_width=4, **TABLE,
    ),
    "swap8_plain": C(
        block_m=8, block_n=128, block_k=128, max_concurrent_steps=3, warp_specialized=False, wg_split="none",
        **TABLE,
    ),
    "swap16_ws_n": C(block_m=16, block_n=64, block_k=64, max_concurrent_steps=4, wg_split="n", **TABLE),
    "swap32_np": C(
        block_m=32, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="none", persistent=False
    ),
}  # fmt: skip


@functools.cache
def _compiled(problem, config):
    # One jit per (problem, config): build() returns a new function each call, which jit would compile
    # again for every routing of one shape.
    return jax.jit(registry.get("mosaic_gpu").build(problem, config))


def _run(config, op, m, k, n, sizes, *, transpose=False, seed=0):
    g = len(sizes)
    problem = Problem(op, m=m, k=k, n=n, g=g, transpose_rhs=transpose)
    fn = _compiled(problem, config)
    key_l, key_r = jax.random.split(jax.random.key(seed))
    lhs = jax.random.normal(key_l, (m, k), jnp.bfloat16)
    rhs = (jax.random.normal(key_r, problem.rhs_shape, jnp.float32) * k**-0.5).astype(jnp.bfloat16)
    empty = jnp.asarray([s == 0 for s in sizes])[:, None, None]
    poisoned = jnp.where(empty, jnp.nan, rhs).astype(jnp.bfloat16)  # experts without rows
    group_sizes = jnp.asarray(sizes, jnp.int32)
    jax.block_until_ready(jnp.full((m, problem.out_n), jnp.nan, jnp.bfloat16)).delete()
    out = np.asarray(fn(lhs, poisoned, group_sizes).astype(jnp.float32))
    ref = np.asarray(reference_of(problem)(lhs, rhs, group_sizes))
    assert np.isfinite(out).all(), "NaN/inf: rows left unwritten, or an empty expert's weights were read"
    err = relative_error(out, ref)
    assert err < tolerance(jnp.bfloat16), f"relative error {err:.3e} for {config} m={m} sizes={sizes}"
    assert not out[min(sum(sizes), m) :].any(), "rows past sum(group_sizes) must be zero"


def _few_rows(rng: random.Random, m: int, g: int) -> list[int]:
    """Rows spread over a random third of g experts, a few rows each; some rows past the last expert."""
    live = rng.sample(range(g), max(1, g // 3))
    sizes = [0] * g
    for row in range(rng.randint(max(1, m - 8), m)):
        sizes[live[row % len(live)]] += 1
    return sizes


@pytest.mark.parametrize("transpose, op", [(False, "grouped_matmul"), (True, "grouped_matmul_swiglu")])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_many_experts_few_rows(name, transpose, op):
    rng = random.Random(4 * sorted(CONFIGS).index(name) + 2 * transpose + (op == "grouped_matmul_swiglu"))
    g = rng.choice([64, 128])
    m = rng.choice([8, 40, 200])
    _run(CONFIGS[name], op, m, 256, 512, _few_rows(rng, m, g), transpose=transpose)


@pytest.mark.parametrize("name", ["table_ws_n", "swap8_plain", "swap16_ws_n", "table_expert"])
def test_edge_routings_over_many_experts(name):
    g = 128
    for sizes in (
        [0] * g,  # every expert empty: all zeros
        [0] * 40 + [120] + [0] * 87,  # every row in one expert
        [0] * 100 + [60, 0, 90] + [0] * 25,  # sum(group_sizes) > M: rows past M are dropped
    ):
        _run(CONFIGS[name], "grouped_matmul", 120, 128, 256, sizes)


@pytest.mark.parametrize("g, topk", [(128, 8), (256, 8), (512, 10)])
@pytest.mark.parametrize("tokens", [1, 128])
@pytest.mark.parametrize("op", ["grouped_matmul", "grouped_matmul_swiglu"])
def test_heuristic_picks_at_the_development_expert_counts(g, topk, tokens, op):
    m, k, n = tokens * topk, 512, 1024
    problem = Problem(op, m=m, k=k, n=n, g=g)
    config = registry.get("mosaic_gpu").heuristic(problem, current_fingerprint())
    rng = random.Random(g + tokens)
    sizes = [0] * g
    for _ in range(tokens):
        for expert in rng.sample(range(g), topk):
            sizes[expert] += 1  # top-k: distinct experts per token
    _run(config, op, m, k, n, sizes)


@pytest.mark.parametrize(
    "op, m, k, n, cta",
    [
        # gpt-oss's widths: N (or F) = 2880 is an odd multiple of 64, K = 1440 (its TP=2 shard) of 32.
        ("grouped_matmul", 4096, 2880, 2880, (128, 64)),
        ("grouped_matmul", 16384, 2880, 2880, (128, 64)),
        ("grouped_matmul_swiglu", 4096, 2880, 5760, (128, 64)),
        ("grouped_matmul", 4096, 1440, 2880, (64, 64)),
    ],
)
def test_heuristic_picks_at_widths_that_rule_out_wide_tiles(op, m, k, n, cta):
    """The narrow CTAs (64 columns; 128 rows with a producer warpgroup where the rows fill them), and
    K steps that divide K, run and match the reference."""
    g, topk = 32, 4
    problem = Problem(op, m=m, k=k, n=n, g=g)
    config = registry.get("mosaic_gpu").heuristic(problem, current_fingerprint())
    assert (config.cta_m, config.cta_n) == cta, config
    assert config.warp_specialized or config.cta_m == 64, config
    assert config.block_k == (32 if k % 64 else 64), config
    rng = random.Random(m + k)
    sizes = [0] * g
    for _ in range(m // topk):
        for expert in rng.sample(range(g), topk):
            sizes[expert] += 1
    _run(config, op, m, k, n, sizes)
