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

The FP8 ops ("grouped_matmul_fp8", "grouped_matmul_swiglu_fp8") share the space: their K steps are
counted in elements of one byte (128 or 256, the bytes of 16-bit steps of 64 or 128), and under block
scales a K step is the scale block (128) and a consumer's columns lie inside one 128-column block.

The domains depend on the problem's regime, so that a sweep of a fine-grained model (dozens of problems)
enumerates a small space per problem: with few rows per expert (memory-bound) the token tile narrows to
8-64 rows (swap_ab) and the 128-row tiles, the epilogue's row split and the expert order (which equals
the "m" order when an expert has one row tile) leave the space; the walk schedule leaves it past
WALK_MAX_GROUPS experts. The heuristic ranks a family of configs with the cost model of
mosaic_gpu_cost.py and takes the best that the space holds.
"""

from __future__ import annotations

import dataclasses
import functools

from moetune.kernels.backends.mosaic_gpu import cost_model as cost
from moetune.kernels.backends.mosaic_gpu import hardware, tiling
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import Unsupported
from moetune.kernels.problem import Problem
from moetune.kernels.space import Constraint, SearchSpace

# Split-K pays for its float32 partial sums only while the output is small (decode).
SPLIT_K_MAX_M = 512
# K need only be a multiple of these, and N (F under swiglu) of N_GRANULE; the last K step and column
# tile may be partial (k_steps_fit, n_tiles_fit), and the operand and output tiles' swizzle narrows to
# what divides them (kernel_sm90).
K_GRANULE = 16
FP8_K_GRANULE = 32
# N: the output is stored through epilogue tiles by which Mosaic GPU tiles the global output too; for
# 16-bit outputs the narrowest that lowers with rows on 128 bytes is 64 columns in 32-column swizzled
# tiles (epilogue_rows_aligned, epilogue_fits_swizzle).
N_GRANULE = 32

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
    "tile_schedule": ("walk", "table"),
    # Staggered consumers hide FP8 block scales' promotions; elsewhere a consumer has none to hide.
    "stagger_consumers": (False,),
}
# With few rows per expert (cost.FEW_ROWS or fewer), where an expert's rows fit one 64-row tile: token
# tiles of 8-32 rows (swap-AB) or 64, no 128-row tile and so no epilogue row split, and two tile orders of
# two widths (with one row tile per expert every order reads each weight once; they differ only in which
# CTAs start first).
FEW_ROWS_DOMAINS: dict[str, tuple] = {
    "block_m": (8, 16, 32, 64),
    "epi_tile_m": (64,),
    "grid_minor_dim": ("m", "n"),
    "grid_tile_width": (1, 4),
}
# Mid-size experts (MID_ROWS or fewer rows each, more than FEW_ROWS): 192-row tiles too, for sweeps to
# try. An expert of 129-192 rows fills one of them where it takes two 128-row tiles, and one of up to 384
# two where 128-row tiles need three; the windows' padding rows are multiplied all the same. Not ranked
# by the heuristic (cost.family) until a sweep has timed them.
MID_ROWS = 320
MID_ROWS_DOMAINS: dict[str, tuple] = {"block_m": (64, 128, 192)}
# The walk schedule unrolls a loop over every group into each tile: past this many experts its code and
# compile time grow past what a sweep can afford (at G=256 one candidate lowered in 3-10 s on a CPU
# against about 1 s for the table), and its per-tile work with them.
WALK_MAX_GROUPS = 64


def k_steps_fit(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> str | None:
    # The last K step may be partial (TMA zero-fills the operands past K, so it adds nothing), and the
    # steps split evenly over split_k CTAs, so that no CTA's step lies wholly past K. Example: K=2880 in
    # 128-wide steps is 22 whole steps and one of 64 columns. Block scales take whole steps: a step's
    # scale blocks are read per step.
    if problem.scale_layout == tiling.BLOCK_SCALE_LAYOUT:
        if problem.k % (config.block_k * config.split_k):
            product = config.block_k * config.split_k
            return f"K={problem.k} is not a multiple of block_k * split_k = {product} (block scales)"
        return None
    steps = tiling.cdiv(problem.k, config.block_k)
    if steps % config.split_k:
        return (
            f"K={problem.k} makes {steps} steps of block_k={config.block_k}, "
            f"not a multiple of split_k={config.split_k}"
        )
    return None


def n_tiles_fit(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> str | None:
    # The last column tile may be partial (its weight columns past N zero-filled, or under swiglu the
    # gate tile's reaching into the up columns, whose products the clipped stores drop; per-channel
    # scales padded past N). Block scales' weight blocks are read per tile and take none yet. Under
    # swiglu the tiles cover the F columns.
    if problem.scale_layout == tiling.BLOCK_SCALE_LAYOUT and problem.out_n % config.cta_n:
        return (
            f"{_out_columns(problem)} is not a multiple of the CTA tile's {config.cta_n} columns "
            f"(block scales take no partial column tile)"
        )
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


def epilogue_fits_swizzle(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> str | None:
    # The epilogue tiles' swizzle narrows to what N divides (tiling.out_swizzle_bytes), and Mosaic GPU
    # finds no layout for the accumulator's store into them (jax 0.11.2: every failing case lowered on a
    # CPU) where a chunk holds more columns than the swizzle has bytes, or under swap_ab (a transposed
    # store) where the swizzle is below 128 bytes.
    item = tiling.geometry(problem, config).out_itemsize
    swizzle = tiling.out_swizzle_bytes(problem.out_n, config.epi_tile_n, item)
    if config.swap_ab and swizzle < 128:
        return f"swap_ab stores through 128-byte swizzled tiles; {_out_columns(problem)} takes {swizzle}"
    if config.epi_tile_n > swizzle:
        return (
            f"epi_tile_n={config.epi_tile_n} is wider than {_out_columns(problem)}'s {swizzle}-byte swizzle "
            f"allows"
        )
    return None


def arch_facts(device: DeviceFingerprint) -> hardware.ArchFacts | str:
    """The device's architecture facts, or why there are none (a constraint returns that reason)."""
    try:
        return hardware.facts(device.compute_capability)
    except Unsupported as e:
        return str(e)


def accumulator_fits_registers(
    problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint
) -> str | None:
    facts = arch_facts(device)
    if isinstance(facts, str):
        return facts
    budget = tiling.consumer_register_budget(config, facts.registers_per_sm)
    count = tiling.accumulators(problem, config)
    need = tiling.accumulator_registers(config, count) + tiling.NON_ACCUMULATOR_REGISTERS
    if need > budget:
        tiles = f"{count} {config.block_m}x{config.block_n} accumulator(s)"
        return f"{tiles} need ~{need} registers/thread > {budget}"
    return None


def smem_fits(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> str | None:
    facts = arch_facts(device)
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


def block_scale_steps(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> str | None:
    # A K step is one or two whole scale blocks, and a consumer's columns lie in one weight block.
    if problem.scale_layout != tiling.BLOCK_SCALE_LAYOUT:
        return None
    if config.block_k not in tiling.BLOCK_SCALED_KS or config.block_n > tiling.SCALE_BLOCK:
        return (
            f"block scales need block_k in {tiling.BLOCK_SCALED_KS} and block_n <= {tiling.SCALE_BLOCK}, "
            f"not block_k={config.block_k}, block_n={config.block_n}"
        )
    return None


def swap_ab_output_16bit(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> str | None:
    # The transposed store into shared memory lowers for 16-bit values only (jax 0.11.2).
    if config.swap_ab and tiling.itemsize(problem.out_dtype) != 2:
        return f"swap_ab stores 16-bit outputs only, not out={problem.out_dtype}"
    return None


def walk_only_few_groups(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> str | None:
    if config.tile_schedule == "walk" and problem.g > WALK_MAX_GROUPS:
        return f"the walk schedule unrolls all G={problem.g} groups into every tile (> {WALK_MAX_GROUPS})"
    return None


def swap_ab_only_few_rows(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> str | None:
    rows = cost.uniform_routing(problem).rows
    if config.swap_ab and rows > cost.FEW_ROWS:
        return f"swap_ab pays up to {cost.FEW_ROWS} rows per expert, not {rows:.0f}"
    return None


def cta_rows_not_wasted(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> str | None:
    # 64 rows is the smallest wgmma tile; beyond that a CTA taller than twice M only multiplies padding.
    if config.cta_m > max(64, 2 * problem.m):
        return f"CTA tile of {config.cta_m} rows for M={problem.m} rows computes mostly padding"
    return None


def domain_values(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> str | None:
    """The fields that the config itself bounds only from below (the tile order's width, split-K) take a
    value of their domain, so a pack cannot carry one no sweep would ever try (grid_tile_width=10**6)."""
    for name in ("grid_tile_width", "split_k"):
        allowed = sorted(set(DOMAINS[name]) | set(FEW_ROWS_DOMAINS.get(name, ())))
        if getattr(config, name) not in allowed:
            return f"{name}={getattr(config, name)} is not one of {', '.join(map(str, allowed))}"
    return None


VALIDITY_CONSTRAINTS: tuple[Constraint, ...] = (
    domain_values,
    k_steps_fit,
    n_tiles_fit,
    split_k_linear,
    tma_box_fits,
    epilogue_rows_aligned,
    epilogue_fits_swizzle,
    block_scale_steps,
    swap_ab_output_16bit,
    accumulator_fits_registers,
    smem_fits,
)
PRUNING_CONSTRAINTS: tuple[Constraint, ...] = (
    split_k_only_small_m,
    pad_lhs_only_small_m,
    cta_rows_not_wasted,
    pipeline_depth_useful,
    walk_only_few_groups,
    swap_ab_only_few_rows,
)
CONSTRAINTS: tuple[Constraint, ...] = VALIDITY_CONSTRAINTS + PRUNING_CONSTRAINTS
RESOURCE_CONSTRAINTS: frozenset[Constraint] = frozenset({accumulator_fits_registers, smem_fits, tma_box_fits})


def check_problem(problem: Problem) -> None:
    """Raise Unsupported when no config of this backend can compute `problem` of an op it serves (the
    backend's check declines the other ops first)."""
    if problem.scale_layout != "none":
        _check_fp8(problem)
        _check_out_columns(problem)
        return
    if problem.lhs_dtype != problem.rhs_dtype or problem.lhs_dtype not in ("bfloat16", "float16"):
        raise Unsupported(
            f"mosaic_gpu needs bfloat16 or float16 operands of one dtype, not "
            f"lhs={problem.lhs_dtype} rhs={problem.rhs_dtype}"
        )
    # A partial last K step is zero-filled by TMA, whose rows must start on 16 bytes; the operand tiles'
    # swizzle narrows to what divides K (kernel_sm90).
    if problem.k % K_GRANULE:
        raise Unsupported(f"K={problem.k} is not a multiple of {K_GRANULE}")
    _check_out_columns(problem)


def _check_out_columns(problem: Problem) -> None:
    """Mosaic GPU tiles the global output (and [K, N] weights) by the shared-memory tiles, and rounds no
    tiled dimension up (jax 0.11.2): N (F under swiglu) must be a whole number of the tiles of some
    epilogue that lowers (N_GRANULE), its last CTA tile partial or not."""
    if problem.out_n % N_GRANULE:
        raise Unsupported(f"{_out_columns(problem)} is not a multiple of {N_GRANULE}")


FP8_OPERANDS = ("float8_e4m3fn", "float8_e5m2")


def _check_fp8(problem: Problem) -> None:
    if problem.lhs_dtype not in FP8_OPERANDS or problem.rhs_dtype not in FP8_OPERANDS:
        raise Unsupported(
            f"mosaic_gpu's FP8 wgmma takes {' or '.join(FP8_OPERANDS)}, not "
            f"lhs={problem.lhs_dtype} rhs={problem.rhs_dtype}"
        )
    if not problem.transpose_rhs:
        raise Unsupported(
            "mosaic_gpu's 8-bit wgmma reads both operands K-major: FP8 weights must be [G, N, K] "
            "(transpose_rhs=True, as checkpoints store them)"
        )
    if problem.scale_layout not in tiling.SCALE_LAYOUTS:
        raise Unsupported(f"mosaic_gpu serves scale layouts {', '.join(tiling.SCALE_LAYOUTS)}")
    block_scaled = problem.scale_layout == tiling.BLOCK_SCALE_LAYOUT
    if block_scaled and problem.k % tiling.SCALE_BLOCK:
        raise Unsupported(f"K={problem.k} is not a multiple of {tiling.SCALE_BLOCK} (a scale block)")
    # 32 bytes: the narrowest swizzle the operand tiles narrow to for a partial last K step.
    if problem.k % FP8_K_GRANULE:
        raise Unsupported(f"K={problem.k} is not a multiple of {FP8_K_GRANULE}")
    gated = problem.spec.rhs_columns_per_out_column == 2
    if gated and problem.scale_layout == tiling.BLOCK_SCALE_LAYOUT and problem.out_n % tiling.SCALE_BLOCK:
        raise Unsupported(
            f"F={problem.out_n} is not a multiple of {tiling.SCALE_BLOCK}: the up columns' scale blocks "
            f"would start inside a block"
        )


def split_k_pays(problem: Problem, device: DeviceFingerprint) -> bool:
    """Split-K pays only where the touched experts' column tiles, at the widest CTA tile, leave SMs idle:
    its float32 partial sums cost a second pass. At Mixtral's M=2-256 they do (2-8 experts x 16 tiles of
    256 columns against 132 SMs, where split-K won on the H200); at DeepSeek-V3's M=8 they do not (8 x 28)."""
    if problem.m > SPLIT_K_MAX_M or not problem.spec.linear_in_k:
        return False
    widest = tiling.cdiv(problem.out_n, tiling.TMA_BOX_MAX)
    return cost.uniform_routing(problem).experts * widest < device.core_count


def domains(problem: Problem, device: DeviceFingerprint) -> dict[str, tuple]:
    """The parameter domains for `problem`'s regime on `device` (module docstring). Values no config of
    the problem can use leave too, so that the space enumerates fewer points: block_k 32 where K is a
    multiple of 64 (it only halves a stage, and won nowhere on the H200), 32-column epilogue tiles where
    the output rows they store would be 64 bytes (only float32 partial sums or outputs fill 128), split-K
    where it does not pay, pad_lhs where M is taller than every CTA tile, the walk past WALK_MAX_GROUPS
    experts. Staggered consumers are offered only under FP8 block scales, the one promotion they hide,
    and 192-row tiles only to mid-size experts."""
    _check(problem)
    out = dict(DOMAINS)
    rows = cost.uniform_routing(problem).rows
    if rows <= cost.FEW_ROWS:
        out.update(FEW_ROWS_DOMAINS)
    elif rows <= MID_ROWS:
        out.update(MID_ROWS_DOMAINS)
    if tiling.itemsize(problem.lhs_dtype) == 1:
        block_scaled = problem.scale_layout == tiling.BLOCK_SCALE_LAYOUT
        out["block_k"] = (128, 256)
        if block_scaled:
            out["block_n"] = tuple(n for n in out["block_n"] if n <= tiling.SCALE_BLOCK)
            out["stagger_consumers"] = (False, True)
    elif problem.k % 64 == 0:
        out["block_k"] = tuple(b for b in out["block_k"] if b >= 64)
    if not split_k_pays(problem, device):
        out["split_k"] = (1,)
    if out["split_k"] == (1,) and tiling.itemsize(problem.out_dtype) == 2:
        out["epi_tile_n"] = tuple(n for n in out["epi_tile_n"] if n * 2 >= 128)
    if problem.m > 2 * max(out["block_m"]):
        out["pad_lhs"] = (False,)
    if problem.g > WALK_MAX_GROUPS:
        out["tile_schedule"] = ("table",)
    return out


def _check(problem: Problem) -> None:
    from moetune.kernels.backends.mosaic_gpu import BACKEND

    BACKEND.check(problem)


def space(problem: Problem, device: DeviceFingerprint) -> SearchSpace:
    return SearchSpace(
        MosaicGpuConfig,
        domains(problem, device),
        CONSTRAINTS,
        seeding=functools.partial(preferred, problem, device),
        validity=VALIDITY_CONSTRAINTS,
    )


# Seeds a sweep starts from: the heuristic's pick and the best-ranked configs of other tile shapes.
SEEDS = 6
# Places of the ranking where near-ties are broken by the family's order (cost.ranked).
RANKED_PLACES = 64
# Valid for every 16-bit problem check_problem() accepts (K a multiple of 16, N or F of 32; a partial
# last K step), and with 128-wide K steps for every FP8 one.
_ALWAYS_VALID = MosaicGpuConfig(
    block_m=64, block_n=64, block_k=32, max_concurrent_steps=2, warp_specialized=False, wg_split="none"
)


@functools.lru_cache(maxsize=512)
def ranking(problem: Problem, device: DeviceFingerprint) -> tuple[tuple[MosaicGpuConfig, cost.Estimate], ...]:
    """The cost model's ranking of the configs of its family that this problem's space holds and every
    constraint admits, best first (dispatch asks once per problem: it is cached)."""
    _check(problem)
    if isinstance(arch_facts(device), str):
        return ()  # no hardware facts: every config fails the resource constraints anyway
    search = SearchSpace(MosaicGpuConfig, domains(problem, device), CONSTRAINTS)
    family = cost.family(problem, device, search.domains)
    admitted = [
        c
        for c in dict.fromkeys(family)
        if search.contains(c) and search.violation(problem, c, device) is None
    ]
    return tuple(cost.ranked(problem, admitted, device, top=RANKED_PLACES))


def preferred(problem: Problem, device: DeviceFingerprint) -> list[MosaicGpuConfig]:
    """A sweep's seeds, best first: the cost model's best config of each of its SEEDS best-ranked tile
    shapes (so that a sweep starts from different shapes, not from one shape's near-copies)."""
    seeds: dict[tuple, MosaicGpuConfig] = {}
    for config, _ in ranking(problem, device):
        seeds.setdefault((config.block_m, config.block_n, config.wg_split, config.warp_specialized), config)
        if len(seeds) == SEEDS:
            break
    return list(seeds.values())


def heuristic(problem: Problem, device: DeviceFingerprint) -> MosaicGpuConfig:
    """A good config without tuning: the cost model's best, ranked over a family of a few hundred configs
    rather than the whole space (dispatch calls this)."""
    fallback = _ALWAYS_VALID
    if problem.scale_layout != "none":  # FP8 K steps are whole 128-byte rows (check_problem: K % 128)
        fallback = dataclasses.replace(_ALWAYS_VALID, block_k=tiling.SCALE_BLOCK)
    return next(iter(preferred(problem, device)), fallback)
