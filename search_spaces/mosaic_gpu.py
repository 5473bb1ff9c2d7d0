"""Search space of the mosaic_gpu backend: domains, named constraints and the heuristic default.

Every constraint is a plain function (problem, config, device) -> None or a one-line reason. Two kinds:
VALIDITY_CONSTRAINTS say whether the kernel can run the config at all (divisibility, TMA limits, shared
memory, registers); the backend's build() refuses a config that breaks one, raising ResourceExceeded
for the hardware limits in RESOURCE_CONSTRAINTS and ConfigInvalid otherwise. PRUNING_CONSTRAINTS only
drop points that are correct but redundant or wasteful, so the search never times them; build() accepts
those. The pruner, build() and the tests call these same functions. Hardware numbers come from
kernels/backends/mosaic_gpu/hardware.py by compute capability.

The same space serves every op of the backend's table ("grouped_matmul", "grouped_matmul_swiglu") and
asks the op's spec, never its name: a gated epilogue (SwiGLU) streams `rhs_columns_per_out_column` = 2
weight tiles per step into two accumulators, so its shared-memory and register needs are larger for the
same config; its output has F = N / 2 columns to tile, and it cannot split K (`linear_in_k`: the
activation is not linear in partial sums).
"""

from __future__ import annotations

import dataclasses

from moetune.kernels.backends.mosaic_gpu import hardware, tiling
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import Unsupported
from moetune.kernels.problem import Problem
from moetune.search_spaces.space import Constraint, SearchSpace

# Split-K pays for its float32 partial sums only while the output is small (decode).
SPLIT_K_MAX_M = 512
# Registers a consumer thread needs beside its accumulator (addresses, epilogue values); empirical.
NON_ACCUMULATOR_REGISTERS = 40

DOMAINS: dict[str, tuple] = {
    "block_m": (64, 128),
    "block_n": (64, 128, 256),
    "block_k": (32, 64, 128),
    "max_concurrent_steps": (2, 3, 4, 5, 6),
    "grid_minor_dim": ("m", "n", "expert"),
    "grid_tile_width": (1, 4, 8, 16),
    "persistent": (True, False),
    "warp_specialized": (True, False),
    "wg_split": ("none", "m", "n"),
    "epi_tile_m": (64, 128),
    "epi_tile_n": (32, 64, 128),
    "split_k": (1, 2, 4),
    "pad_lhs": (False, True),
}


def k_divisible(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> str | None:
    if problem.k % (config.block_k * config.split_k):
        return f"K={problem.k} is not a multiple of block_k * split_k = {config.block_k * config.split_k}"
    return None


def n_divisible(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> str | None:
    # Under swiglu the tiles cover the F output columns, and an up tile sits F columns after its gate.
    if problem.out_n % config.cta_n:
        return f"{_out_columns(problem)} is not a multiple of the CTA tile's {config.cta_n} columns"
    return None


def _out_columns(problem: Problem) -> str:
    return f"{problem.spec.out_columns}={problem.out_n}"


def split_k_linear(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> str | None:
    if config.split_k > 1 and not problem.spec.linear_in_k:
        epilogue = problem.spec.epilogue
        return f"split_k={config.split_k}: the {epilogue} epilogue needs the whole K sum in one CTA"
    return None


def tma_box_fits(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> str | None:
    if max(config.cta_m, config.cta_n) > tiling.TMA_BOX_MAX:
        return f"CTA tile {config.cta_m}x{config.cta_n} exceeds the TMA box limit of {tiling.TMA_BOX_MAX}"
    return None


def epilogue_rows_aligned(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> str | None:
    # A TMA store may start at any row of the epilogue tile, so every row must start on 128 bytes.
    row_bytes = config.epi_tile_n * tiling.geometry(problem, config).out_itemsize
    if row_bytes % 128:
        return f"epi_tile_n={config.epi_tile_n} gives {row_bytes}-byte rows; TMA stores need multiples of 128"
    return None


def _facts(device: DeviceFingerprint) -> hardware.ArchFacts | str:
    try:
        return hardware.facts(device.compute_capability)
    except Unsupported as e:
        return str(e)


def accumulator_fits_registers(
    problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint
) -> str | None:
    facts = _facts(device)
    if isinstance(facts, str):
        return facts
    budget = tiling.consumer_register_budget(config, facts.registers_per_sm)
    count = tiling.accumulators(problem)
    need = tiling.accumulator_registers(config, count) + NON_ACCUMULATOR_REGISTERS
    if need > budget:
        tiles = f"{count} {config.block_m}x{config.block_n} accumulator(s)"
        return f"{tiles} need ~{need} registers/thread > {budget}"
    return None


def smem_fits(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> str | None:
    facts = _facts(device)
    if isinstance(facts, str):
        return facts
    limit = facts.smem_per_block
    need = tiling.smem_bytes(problem, config)
    if need > limit:
        return f"needs {need} bytes of shared memory per CTA > {limit}"
    return None


def pipeline_depth_useful(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> str | None:
    steps = tiling.geometry(problem, config).k_steps
    if config.max_concurrent_steps > max(2, steps):
        return f"max_concurrent_steps={config.max_concurrent_steps} exceeds the {steps} K steps per tile"
    return None


def split_k_only_small_m(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> str | None:
    if config.split_k > 1 and problem.m > SPLIT_K_MAX_M:
        return f"split_k={config.split_k} only pays for M <= {SPLIT_K_MAX_M}, not M={problem.m}"
    return None


def pad_lhs_only_small_m(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> str | None:
    # The kernel pads only an lhs of at most one CTA tile's rows; for taller ones the flag changes nothing.
    if config.pad_lhs and problem.m > config.cta_m:
        return f"pad_lhs pads only M <= the {config.cta_m}-row CTA tile, not M={problem.m}"
    return None


def cta_rows_not_wasted(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> str | None:
    # 64 rows is the smallest wgmma tile; beyond that a CTA taller than twice M only multiplies padding.
    if config.cta_m > max(64, 2 * problem.m):
        return f"CTA tile of {config.cta_m} rows for M={problem.m} rows computes mostly padding"
    return None


VALIDITY_CONSTRAINTS: tuple[Constraint, ...] = (
    k_divisible,
    n_divisible,
    split_k_linear,
    tma_box_fits,
    epilogue_rows_aligned,
    accumulator_fits_registers,
    smem_fits,
)
PRUNING_CONSTRAINTS: tuple[Constraint, ...] = (
    split_k_only_small_m,
    pad_lhs_only_small_m,
    cta_rows_not_wasted,
    pipeline_depth_useful,
)
CONSTRAINTS: tuple[Constraint, ...] = VALIDITY_CONSTRAINTS + PRUNING_CONSTRAINTS
RESOURCE_CONSTRAINTS: frozenset[Constraint] = frozenset({accumulator_fits_registers, smem_fits, tma_box_fits})


def check_problem(problem: Problem) -> None:
    """Raise Unsupported when no config of this backend can compute `problem` of an op it serves (the
    backend's check declines the other ops first)."""
    if problem.lhs_dtype != problem.rhs_dtype or problem.lhs_dtype not in ("bfloat16", "float16"):
        raise Unsupported(
            f"mosaic_gpu needs bfloat16 or float16 operands of one dtype, not "
            f"lhs={problem.lhs_dtype} rhs={problem.rhs_dtype}"
        )
    if problem.k % 32:
        raise Unsupported(f"K={problem.k} is not a multiple of 32 (the smallest block_k)")
    if problem.out_n % 64:
        raise Unsupported(f"{_out_columns(problem)} is not a multiple of 64 (the smallest block_n)")


def _check(problem: Problem) -> None:
    from moetune.kernels.backends.mosaic_gpu import BACKEND

    BACKEND.check(problem)


def space(problem: Problem, device: DeviceFingerprint) -> SearchSpace:
    _check(problem)
    domains = dict(DOMAINS)
    if problem.m > SPLIT_K_MAX_M or not problem.spec.linear_in_k:
        domains["split_k"] = (1,)
    seeds = tuple(preferred(problem, device))
    return SearchSpace(MosaicGpuConfig, domains, CONSTRAINTS, seeds=seeds, validity=VALIDITY_CONSTRAINTS)


# Preferred configs in order (H200 measurements in benchmarks/README.md); the heuristic takes the first
# that the problem admits. Few rows per expert: stream weights through a 64x256 CTA tile, producer and
# two consumers. Many rows: a 128x256 CTA tile, two consumers each 128x128.
_MEMORY_BOUND = (
    MosaicGpuConfig(block_m=64, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="n"),
    MosaicGpuConfig(block_m=64, block_n=64, block_k=64, max_concurrent_steps=4, wg_split="n"),
)


def _in_expert_order(configs: tuple[MosaicGpuConfig, ...]) -> tuple[MosaicGpuConfig, ...]:
    return tuple(dataclasses.replace(c, grid_minor_dim="expert") for c in configs)


_COMPUTE_BOUND_TILES = (
    MosaicGpuConfig(block_m=128, block_n=128, block_k=128, max_concurrent_steps=2, wg_split="n"),
    MosaicGpuConfig(block_m=128, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="n"),
    MosaicGpuConfig(block_m=64, block_n=256, block_k=64, max_concurrent_steps=4, wg_split="m"),
)
# Walked one expert at a time first. On the H200, at Mixtral's Zipf-routed GEMMs for T=1024-4096, these tiles
# took up to 12.6% less time in that order than in the "m" order (level at down T=1024; one run of one tile
# 6.5% slower), and -1.0% to +1.0% at the balanced ones (bench_gemm.py, 2026-11-30); real routing is
# rarely balanced. The "m" order stays in the list so that sweeps start from both.
_COMPUTE_BOUND = _in_expert_order(_COMPUTE_BOUND_TILES) + _COMPUTE_BOUND_TILES
# Under the SwiGLU epilogue each consumer holds two accumulators and each stage two weight tiles: the
# same CTA shapes with half the columns per warpgroup, or fewer stages, fit the registers and shared memory.
_SWIGLU_MEMORY_BOUND = (
    MosaicGpuConfig(block_m=64, block_n=64, block_k=64, max_concurrent_steps=4, wg_split="n"),
)
_SWIGLU_COMPUTE_BOUND_TILES = (
    MosaicGpuConfig(block_m=128, block_n=64, block_k=64, max_concurrent_steps=3, wg_split="n"),
    MosaicGpuConfig(block_m=64, block_n=128, block_k=64, max_concurrent_steps=3, wg_split="m"),
)
# Under the SwiGLU epilogue the expert order paid off up to 1024 rows per expert and not above: in an H200
# sweep of Mixtral's gate_up (2026-11-30; same config in both orders, same run; objective over balanced and
# Zipf routing) it took 0.922-1.009x the "m" order's time at M=1024-8192 (6 of 9 pairs faster) and
# 1.012-1.048x at M=16384-32768 (all 4 slower).
SWIGLU_EXPERT_ORDER_MAX_ROWS = 1024
_SWIGLU_COMPUTE_BOUND = _SWIGLU_COMPUTE_BOUND_TILES + _in_expert_order(_SWIGLU_COMPUTE_BOUND_TILES)
_SWIGLU_COMPUTE_BOUND_FEW_ROWS = _in_expert_order(_SWIGLU_COMPUTE_BOUND_TILES) + _SWIGLU_COMPUTE_BOUND_TILES
# A quarter of a row per expert or less (decode: top-k rows over G experts, so at most that many experts'
# weights are read): one warpgroup per 64x256 weight tile, one CTA per tile, and for the plain GEMM split-K
# so that the touched experts' few column tiles fill the SMs. These were the winners of the 2026-11-30 H200
# sweep at T=1 (Mixtral m=2): 1.15x (gate_up+SwiGLU) and 1.39x (down) over the memory-bound default.
# With pad_lhs, the T=1 SwiGLU winner of the pack (this tile, column tiles one at a time) took 111.7 us
# against 118.0, and the down one 60.9 against 57.7: its pad is a copy of its own.
_DECODE = (
    MosaicGpuConfig(
        block_m=64,
        block_n=256,
        block_k=64,
        max_concurrent_steps=3,
        grid_tile_width=1,
        persistent=False,
        warp_specialized=False,
        wg_split="none",
        split_k=4,
    ),
)
_SWIGLU_DECODE = (
    MosaicGpuConfig(
        block_m=64,
        block_n=128,
        block_k=64,
        max_concurrent_steps=4,
        grid_minor_dim="n",
        grid_tile_width=4,
        persistent=False,
        warp_specialized=False,
        wg_split="none",
        pad_lhs=True,
    ),
)
DECODE_ROWS_PER_EXPERT = 0.25
# Valid for every problem check_problem() accepts: K % 32 == 0, N (or F) % 64 == 0, 16-bit operands.
_ALWAYS_VALID = MosaicGpuConfig(
    block_m=64, block_n=64, block_k=32, max_concurrent_steps=2, warp_specialized=False, wg_split="none"
)


@dataclasses.dataclass(frozen=True)
class _Ranking:
    """The preferred configs of one kind of CTA, best first, by regime: decode (at most
    DECODE_ROWS_PER_EXPERT rows per expert), memory-bound (up to 64), compute-bound; up to `few_rows_max`
    rows per expert the compute-bound ones go in `compute_bound_few_rows`' order."""

    decode: tuple[MosaicGpuConfig, ...]
    memory_bound: tuple[MosaicGpuConfig, ...]
    compute_bound: tuple[MosaicGpuConfig, ...]
    few_rows_max: float = 0
    compute_bound_few_rows: tuple[MosaicGpuConfig, ...] = ()


# By accumulators per CTA (tiling.accumulators, the op's rhs columns per output column): the plain GEMM's
# one, and the two of the SwiGLU epilogue's gate and up.
_RANKINGS = {
    1: _Ranking(_DECODE, _MEMORY_BOUND, _COMPUTE_BOUND),
    2: _Ranking(
        _SWIGLU_DECODE,
        _SWIGLU_MEMORY_BOUND,
        _SWIGLU_COMPUTE_BOUND,
        few_rows_max=SWIGLU_EXPERT_ORDER_MAX_ROWS,
        compute_bound_few_rows=_SWIGLU_COMPUTE_BOUND_FEW_ROWS,
    ),
}


def preferred(problem: Problem, device: DeviceFingerprint) -> list[MosaicGpuConfig]:
    """The preferred configs this problem admits, best first (sweeps start from all of them: on the H200
    the second SwiGLU compute-bound one beat the first, which the heuristic picks, by 2% at T=4096)."""
    _check(problem)
    rows_per_expert = problem.m / problem.g
    ranking = _RANKINGS[tiling.accumulators(problem)]
    if rows_per_expert <= DECODE_ROWS_PER_EXPERT:
        ranked = ranking.decode + ranking.memory_bound
    elif rows_per_expert <= 64:
        ranked = ranking.memory_bound
    elif rows_per_expert <= ranking.few_rows_max:
        ranked = ranking.compute_bound_few_rows + ranking.memory_bound
    else:
        ranked = ranking.compute_bound + ranking.memory_bound
    return [c for c in ranked if all(check(problem, c, device) is None for check in VALIDITY_CONSTRAINTS)]


def heuristic(problem: Problem, device: DeviceFingerprint) -> MosaicGpuConfig:
    """A good config without tuning, chosen without enumerating the space (dispatch calls this)."""
    return next(iter(preferred(problem, device)), _ALWAYS_VALID)
