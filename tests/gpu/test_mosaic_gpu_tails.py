"""Widths that are no multiple of the tile on a Hopper GPU, at full size, against the float32 reference.

gpt-oss-120b (128 experts, top-4, hidden and FFN 2880) at T = 4096 and 16384 tokens: its gate_up with the
SwiGLU epilogue (F = 2880, 22.5 tiles of 128) and its down (K = N = 2880; at TP=2, K = 1440: a last K
step of 32 columns under a 64-byte swizzle), the heuristic's config and fixed full-width ones with a
partial last K step and column tile; the widths 5760, 1408 and 2816; and the FP8 forms with scales
constant along K (per tensor, per token x per channel); and the weight gradient (K = N = 2880, 2F = 5760:
22.5 tiles of 128 along P and Q). At TP=2 the column-split widths are 1440 = 22.5 x 64, which narrow the
output tiles' and [K, N] weight tiles' swizzle to 64 bytes. The output buffer is poisoned (a NaN allocation
freed just before the call), so an unwritten element shows as NaN.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

jax = pytest.importorskip("jax")
jnp = jax.numpy

from moetune.kernels import ops, registry  # noqa: E402
from moetune.kernels.backends.mosaic_gpu import space  # noqa: E402
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig  # noqa: E402
from moetune.kernels.device import current_fingerprint  # noqa: E402
from moetune.kernels.problem import Problem  # noqa: E402
from moetune.kernels.reference import reference_of, relative_error, tolerance  # noqa: E402

EXPERTS, TOP_K = 128, 4
# Full-width tiles: 256-column CTAs of 128-wide K steps (two 128x128 consumers), and one 128x64 consumer
# pair of 64-wide steps for the SwiGLU epilogue's two accumulators.
WIDE = MosaicGpuConfig(block_m=128, block_n=128, block_k=128, max_concurrent_steps=2, wg_split="n")
WIDE_SWIGLU = MosaicGpuConfig(block_m=128, block_n=64, block_k=128, max_concurrent_steps=2, wg_split="n")


def _sizes(m: int, g: int, seed: int) -> jax.Array:
    """Balanced-ish routing with a few empty experts: every row in some group."""
    rng = np.random.default_rng(seed)
    weights = rng.random(g) * (rng.random(g) > 0.05)
    sizes = np.floor(weights / weights.sum() * m).astype(np.int32)
    sizes[np.argmax(sizes)] += m - sizes.sum()
    return jnp.asarray(sizes)


def _run(op: str, tokens: int, k: int, n: int, config: MosaicGpuConfig | None, transpose: bool = False):
    m = tokens * TOP_K
    problem = Problem(op, m=m, k=k, n=n, g=EXPERTS, transpose_rhs=transpose)
    if config is None:
        config = space.heuristic(problem, current_fingerprint())
    print(f"{op} T={tokens} K={k} N={n}: {config}")
    fn = jax.jit(registry.get("mosaic_gpu").build(problem, config))
    key_l, key_r = jax.random.split(jax.random.key(k + n))
    lhs = jax.random.normal(key_l, (m, k), jnp.bfloat16)
    shape = (EXPERTS, n, k) if transpose else (EXPERTS, k, n)
    rhs = (jax.random.normal(key_r, shape, jnp.bfloat16) * 0.05).astype(jnp.bfloat16)
    group_sizes = _sizes(m, EXPERTS, seed=tokens)
    jax.block_until_ready(jnp.full((m, problem.out_n), jnp.nan, jnp.bfloat16)).delete()
    out = np.asarray(fn(lhs, rhs, group_sizes).astype(jnp.float32))
    ref = np.asarray(reference_of(problem)(lhs, rhs, group_sizes))
    assert out.shape == (m, problem.out_n)
    assert np.isfinite(out).all(), "NaN/inf in the output: some elements were not written"
    err = relative_error(out, ref)
    assert err < tolerance(jnp.bfloat16), f"relative error {err:.3e} for {config}"


@pytest.mark.parametrize("tokens", [4096, 16384])
@pytest.mark.parametrize("k", [2880, 1440])
@pytest.mark.parametrize("fixed", [False, True])
def test_gpt_oss_down(k, tokens, fixed):
    _run("grouped_matmul", tokens, k, 2880, WIDE if fixed else None)


@pytest.mark.parametrize("tokens", [4096, 16384])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("fixed", [False, True])
def test_gpt_oss_gate_up_swiglu(tokens, transpose, fixed):
    _run("grouped_matmul_swiglu", tokens, 2880, 2 * 2880, WIDE_SWIGLU if fixed else None, transpose)


@pytest.mark.parametrize("tokens", [4096, 16384])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("fixed", [False, True])
def test_gpt_oss_tensor_parallel_widths(tokens, transpose, fixed):
    # gate_up's F and a column-split down's N at TP=2: 1440 = 22.5 x 64 columns, stored through 64-byte
    # swizzled tiles.
    _run("grouped_matmul_swiglu", tokens, 2880, 2 * 1440, WIDE_SWIGLU if fixed else None, transpose)
    _run("grouped_matmul", tokens, 2880, 1440, WIDE if fixed else None, transpose)


@pytest.mark.parametrize("k, n", [(2880, 5760), (2048, 1408), (1408, 2816), (1440, 1408)])
@pytest.mark.parametrize("transpose", [False, True])
def test_other_widths_with_tails(k, n, transpose):
    _run("grouped_matmul", 4096, k, n, WIDE, transpose)
    _run("grouped_matmul", 4096, k, n, None, transpose)


FP8 = "float8_e4m3fn"
# FP8 K steps of 256 (11.25 of them at K = 2880 under a 64-byte swizzle, 5.625 at 1440 under 32 bytes).
WIDE_FP8 = MosaicGpuConfig(block_m=128, block_n=128, block_k=256, max_concurrent_steps=2, wg_split="n")
WIDE_FP8_SWIGLU = MosaicGpuConfig(block_m=128, block_n=64, block_k=256, max_concurrent_steps=2, wg_split="n")


@pytest.mark.parametrize("layout", ["row_channel", "tensor"])
@pytest.mark.parametrize(
    "op, k, n",
    [
        ("grouped_matmul_fp8", 2880, 2880),
        ("grouped_matmul_fp8", 1440, 2880),
        ("grouped_matmul_swiglu_fp8", 2880, 5760),
        ("grouped_matmul_fp8", 2880, 1440),
        ("grouped_matmul_swiglu_fp8", 2880, 2880),
    ],
)
@pytest.mark.parametrize("fixed", [False, True])
def test_gpt_oss_fp8(op, k, n, layout, fixed):
    tokens = 4096
    m = tokens * TOP_K
    problem = Problem(op, m, k, n, EXPERTS, FP8, FP8, "bfloat16", True, scale_layout=layout)
    config = (WIDE_FP8_SWIGLU if op.endswith("swiglu_fp8") else WIDE_FP8) if fixed else None
    if config is None:
        config = space.heuristic(problem, current_fingerprint())
    print(f"{op} {layout} T={tokens} K={k} N={n}: {config}")
    spec = ops.get(op)
    key_l, key_r = jax.random.split(jax.random.key(k + n))
    lhs, lhs_scale = spec.draw(problem, "lhs", key_l)
    rhs, rhs_scale = spec.draw(problem, "rhs", key_r)
    args = (lhs, lhs_scale, rhs, rhs_scale, _sizes(m, EXPERTS, seed=1))
    fn = jax.jit(registry.get("mosaic_gpu").build(problem, config))
    jax.block_until_ready(jnp.full((m, problem.out_n), jnp.nan, jnp.bfloat16)).delete()
    out = np.asarray(fn(*args).astype(jnp.float32))
    ref = np.asarray(spec.reference(*args, transpose_rhs=True))
    assert np.isfinite(out).all(), "NaN/inf in the output: some elements were not written"
    err = relative_error(out, ref)
    assert err < spec.tolerance["bfloat16"], f"relative error {err:.3e} for {config}"


@pytest.mark.parametrize("k, n", [(2880, 2880), (2880, 5760), (1440, 2880), (2880, 1440)])
@pytest.mark.parametrize("transpose", [False, True])
def test_gpt_oss_weight_gradient(k, n, transpose):
    m = 4096 * TOP_K
    problem = Problem("grouped_matmul_drhs", m, k, n, EXPERTS, transpose_rhs=transpose)
    config = registry.get("mosaic_gpu").heuristic(problem, current_fingerprint())
    print(f"grouped_matmul_drhs T=4096 K={k} N={n} transpose={transpose}: {config}")
    key_l, key_d = jax.random.split(jax.random.key(k + n))
    lhs = jax.random.normal(key_l, (m, k), jnp.bfloat16)
    dout = jax.random.normal(key_d, (m, n), jnp.bfloat16)
    group_sizes = _sizes(m, EXPERTS, seed=2)
    fn = jax.jit(registry.get("mosaic_gpu").build(problem, config))
    shape = (EXPERTS, n, k) if transpose else (EXPERTS, k, n)
    jax.block_until_ready(jnp.full(shape, jnp.nan, jnp.bfloat16)).delete()
    out = np.asarray(fn(lhs, dout, group_sizes).astype(jnp.float32))
    ref = np.asarray(reference_of(problem)(lhs, dout, group_sizes))
    assert out.shape == shape
    assert np.isfinite(out).all(), "NaN/inf in the output: some elements were not written"
    err = relative_error(out, ref)
    assert err < tolerance(jnp.bfloat16), f"relative error {err:.3e} for {config}"
