"""lab/bench/bench_gemm.py's ragged_dot_mgpu sweep on a CPU: the configs exist, fit and lower."""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp

# jax's Pallas GPU ops import jax's test utilities, which need absl-py (the dev extra has it).
from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu

from moetune.kernels.backends.mosaic_gpu import hardware
from moetune_lab.bench import bench_gemm, moe_shapes


def smem_bytes(params: dict) -> int:
    stage = (params["block_m"] + params["block_n"]) * params["block_k"] * 2  # bf16 lhs and rhs tiles
    return params["max_concurrent_steps"] * stage + params["block_m"] * params["block_n"] * 2  # + out tile


def test_the_full_mgpu_sweep_has_20_configs_that_divide_n_fit_and_lower_for_hopper():
    sweep = bench_gemm.MGPU_FULL_SWEEP
    assert len({json.dumps(p, sort_keys=True) for p in sweep}) == len(sweep) == 20
    assert bench_gemm.MGPU_DEFAULT not in sweep and all(p in sweep for p in bench_gemm.MGPU_SWEEP)
    assert max(map(smem_bytes, sweep)) <= hardware.facts("9.0").smem_per_block
    for _, n in moe_shapes.PROJECTIONS.values():
        assert all(n % (p["block_n"] * p["grid_block_n"]) == 0 for p in sweep)
    shapes = (((8192, 4096), jnp.bfloat16), ((8, 4096, 28672), jnp.bfloat16), ((8,), jnp.int32))
    for params in sorted(sweep, key=smem_bytes)[-2:]:  # the two largest: Mosaic GPU's own checks pass
        call = functools.partial(bench_gemm._mgpu_call, ragged_dot_mgpu.ragged_dot, params=params)
        jax.export.export(jax.jit(call), platforms=["cuda"])(*[jax.ShapeDtypeStruct(*a) for a in shapes])


def test_the_default_pack_is_the_shipped_one_that_dispatch_reads():
    from moetune.kernels import packs

    path = moe_shapes.SHIPPED_PACK
    assert path.is_file(), path
    assert path.parent.name == "tuned" and path.parent.parent.name == "configs"
    assert packs.load(path).entries


def test_the_shipped_packs_gemm_winners_load_and_its_decode_block_entries_are_left_out():
    # The shipped pack holds decode-block winners (a Config of their own): reading them as GEMM configs
    # failed bench_gemm at start.
    from moetune.kernels import packs

    entries = packs.load(moe_shapes.SHIPPED_PACK).entries
    gemm_keys = {e.problem.key for e in entries if e.problem.op != "moe_decode_block"}
    assert len(gemm_keys) < len(entries)
    assert set(bench_gemm.pack_winners(str(moe_shapes.SHIPPED_PACK))) == gemm_keys
