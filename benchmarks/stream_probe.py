"""A probe kernel for the T=1 GEMMs' read rate (benchmarks/decode_ops.py --only stream): the weight tiles
streamed through the same TMA pipeline as the plain Hopper kernel, with the kernel's other parts (the lhs
tile copies, the wgmmas) switched on one at a time, so that what each costs can be timed apart."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

# (block_k, block_n, stages) of the streaming probe: the shipped T=1 tiles, then deeper and wider ones.
STREAM_TILES = [(64, 256, 3), (64, 256, 4), (64, 128, 4), (64, 256, 6), (128, 256, 3), (128, 128, 6)]
# Tiles of the plain kernel's T=1 winners (down 64x256k64s3, gate_up 64x256k64s2): the probe adds the lhs
# copies and the wgmmas to the TMA-only stream one at a time.
STREAM_PARTS = [(64, 256, 3), (64, 256, 2)]


def stream_weights(
    w,
    x,
    experts: tuple[int, ...],
    *,
    block_k: int,
    block_n: int,
    stages: int,
    lhs=False,
    mma=False,
    lhs_rows=64,
):
    """Every [block_k, block_n] tile of the given experts' [K, N] weights copied into shared memory by TMA
    through a `stages`-deep pipeline, one CTA per (expert, column tile), as the plain T=1 kernels run.
    `lhs` also copies a 64-row tile of x [rows, K] each step (rows past x's are TMA's zero fill, as in the
    kernel at T=1); `mma` multiplies it (or, without `lhs`, a fixed shared-memory tile) into a float32
    accumulator with one wgmma group left in flight and the slot released a step late, as the plain kernel
    does. `lhs_rows` < 64 copies boxes that tall instead (no wgmma then: it needs 64 rows). Returns
    [CTAs, 64, 64] bfloat16: the accumulator's first 64 columns under `mma`, else junk."""
    _, k, n = w.shape
    col_tiles = n // block_n
    transforms = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    delay = 1 if mma and stages > 1 else 0

    def body(x_ref, w_ref, out_ref):
        cta = lax.axis_index("cta")
        slot, col = cta // col_tiles, cta % col_tiles
        expert = experts[0]
        for i, e in enumerate(experts[1:], 1):
            expert = jnp.where(slot == i, e, expert)

        def scoped(a_fixed, o_smem):
            pl.run_scoped(functools.partial(with_acc, a_fixed, o_smem), plgpu.ACC((64, block_n), jnp.float32))

        def with_acc(a_fixed, o_smem, acc):
            def step(_, *tiles):
                a_smem, w_smem = tiles if lhs else (a_fixed, tiles[0])
                if mma:
                    plgpu.wgmma(acc, a_smem, w_smem)
                    plgpu.wgmma_wait(delay)

            specs = [
                plgpu.BlockSpec(
                    (block_k, block_n), lambda kk: (kk, col), transforms=transforms, delay_release=delay
                )
            ]
            operands = [w_ref.at[expert]]
            if lhs:
                lhs_spec = plgpu.BlockSpec(
                    (pl.Element(lhs_rows), block_k),
                    lambda kk: (0, kk),
                    transforms=transforms,
                    delay_release=delay,
                )
                specs, operands = [lhs_spec, *specs], [x_ref, *operands]
            plgpu.emit_pipeline(step, grid=(k // block_k,), in_specs=specs, max_concurrent_steps=stages)(
                *operands
            )
            if mma:
                o_smem[...] = acc[...][:, :64].astype(jnp.bfloat16)
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(o_smem, out_ref.at[cta])
                plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(
            scoped,
            plgpu.SMEM((64, block_k), jnp.bfloat16, transforms=transforms),
            plgpu.SMEM((64, 64), jnp.bfloat16),
        )

    ctas = len(experts) * col_tiles
    kernel = plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((ctas, 64, 64), jnp.bfloat16),
        grid=(ctas,),
        grid_names=("cta",),
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        kernel_name=f"stream_k{block_k}n{block_n}s{stages}{'_lhs' if lhs else ''}{'_mma' if mma else ''}",
    )
    return kernel(x, w)
