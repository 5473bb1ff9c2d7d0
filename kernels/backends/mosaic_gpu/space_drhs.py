"""Search space of the mosaic_gpu backend's weight-gradient kernel (an op whose output is one slice per
expert, `OpSpec.out_grouped`; kernels/backends/mosaic_gpu/kernel_drhs.py).

The tunables are the contraction step (block_m rows of the ragged dimension per pipeline step), the output
tile (block_k x block_n per consumer warpgroup), the pipeline depth, the persistent grid and the pipeline
kind (one warpgroup; a producer and one consumer; a producer and two consumers splitting the tile's Q
side). The kernel walks experts one after another, so the forward kernel's tile order, epilogue chunks,
split-K, lhs padding and tile schedule play no part: they are fixed at their defaults, and a config that
sets them is invalid (not silently the same kernel under another name).

The heuristic ranks the whole space (a few thousand points) with a small cost model: per work item, its
expected contraction steps (an expert of r rows spans r / block_m + 1 steps from a random start), each the
longer of its wgmmas and its operand copies through the SM's port, plus the zeroing of the first and last
step's foreign rows and the pipeline's fill (once per CTA where a producer warpgroup chains a persistent
CTA's items into one pipeline, once per item otherwise; a CTA per item also pays its start, exit and store
drain);
items spread over the persistent CTAs in waves; the whole bounded below by the HBM traffic of the [G, K, N]
output and of the operands, which the tile order decides (`operand_traffic`). A chained item is also
bounded by its shared-memory traffic (`smem_bytes_per_item`), and with two stages its copies are not
overlapped with its wgmmas.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from moetune.kernels.backends.mosaic_gpu import cost_model as cost
from moetune.kernels.backends.mosaic_gpu import hardware, tiling
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig
from moetune.kernels.backends.mosaic_gpu.space import arch_facts
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import Unsupported
from moetune.kernels.problem import Problem
from moetune.kernels.space import Constraint, SearchSpace

_DEFAULTS = MosaicGpuConfig()
# Fields the kernel does not read: each stays at its default.
FIXED = (
    "epi_tile_m",
    "epi_tile_n",
    "split_k",
    "pad_lhs",
    "tile_schedule",
    "stagger_consumers",
)

DOMAINS: dict[str, tuple] = {
    "block_m": (64, 128),
    "block_n": (64, 128, 256),
    "block_k": (64, 128),
    "max_concurrent_steps": (2, 3, 4, 5, 6),
    "persistent": (True, False),
    "warp_specialized": (True, False),
    "wg_split": ("none", "n"),
    "grid_minor_dim": ("m", "n"),
    "grid_tile_width": (1, 4, 8, 16),
    **{name: (getattr(_DEFAULTS, name),) for name in FIXED},
}
# Model fractions of the tensor cores' rate: one warpgroup both issuing copies and multiplying keeps one
# wgmma group in flight; a producer warpgroup keeps the consumers' wgmmas back to back.
PLAIN_EFFICIENCY = 0.75
SPECIALIZED_EFFICIENCY = 0.9
# What a CTA of one item pays beyond a persistent CTA's item (start, barrier setup, exit): on the H200,
# Mixtral-8x7B's gate_up weight gradient at T=4096 took 4.27 ms in 28,672 one-item CTAs against 3.28 ms
# persistent, the same config otherwise (lab/bench/bench_backward.py), 4.5 us per item of which the
# store's drain is about 0.7.
CTA_ITEM_S = 3.8e-6
PROLOGUE_S = 3e-6  # the group bounds' cumulative sum, an XLA fusion before the kernel
SEEDS = 6
# The cost model's resolution: estimates closer than this are a tie. Its terms are per FLOP alike for
# every tile size, so left to itself it ranks tiles by rounding (waves, edge steps) far below its error.
TIE = 0.01


def fixed_fields_at_defaults(
    problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint
) -> str | None:
    changed = [
        f"{name}={getattr(config, name)!r}"
        for name in FIXED
        if getattr(config, name) != getattr(_DEFAULTS, name)
    ]
    if changed:
        return f"the weight-gradient kernel does not use {', '.join(changed)}; leave them at their defaults"
    return None


def kernel_shape_supported(
    problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint
) -> str | None:
    if config.wg_split == "m":
        return "wg_split='m' would split the contraction rows between consumers; use 'n' or 'none'"
    if config.grid_minor_dim == "expert":
        return "grid_minor_dim='expert': experts are walked one after another already; use 'm' or 'n'"
    if config.block_m < 64:
        return f"block_m={config.block_m}: the contraction step is wgmma's K side, at least 64 rows here"
    if config.block_k % 64:
        return f"block_k={config.block_k}: the output tile's sides are whole 64-row wgmma tiles"
    return None


def tma_box_fits(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> str | None:
    t = tiling.drhs_tiles(problem.k, problem.n, problem.transpose_rhs, config)
    if max(config.block_m, t.tile_p, t.cta_q) > tiling.TMA_BOX_MAX:
        tile = f"{config.block_m}x{max(t.tile_p, t.cta_q)}"
        return f"a {tile} tile exceeds the TMA box limit of {tiling.TMA_BOX_MAX}"
    return None


def accumulator_fits_registers(
    problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint
) -> str | None:
    facts = arch_facts(device)
    if isinstance(facts, str):
        return facts
    budget = tiling.consumer_register_budget(config, facts.registers_per_sm)
    need = config.block_k * config.block_n // 128 + tiling.NON_ACCUMULATOR_REGISTERS
    if need > budget:
        return f"a {config.block_k}x{config.block_n} accumulator needs ~{need} registers/thread > {budget}"
    return None


def smem_fits(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> str | None:
    facts = arch_facts(device)
    if isinstance(facts, str):
        return facts
    need = tiling.drhs_smem_bytes(problem, config)
    if need > facts.smem_per_block:
        return f"needs {need} bytes of shared memory per CTA > {facts.smem_per_block}"
    return None


def pipeline_depth_useful(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> str | None:
    steps = math.ceil(expected_steps(problem, config))
    if config.max_concurrent_steps > max(2, steps):
        return f"max_concurrent_steps={config.max_concurrent_steps} exceeds the ~{steps} steps of an expert"
    return None


VALIDITY_CONSTRAINTS: tuple[Constraint, ...] = (
    fixed_fields_at_defaults,
    kernel_shape_supported,
    tma_box_fits,
    accumulator_fits_registers,
    smem_fits,
)
PRUNING_CONSTRAINTS: tuple[Constraint, ...] = (pipeline_depth_useful,)
CONSTRAINTS: tuple[Constraint, ...] = VALIDITY_CONSTRAINTS + PRUNING_CONSTRAINTS
RESOURCE_CONSTRAINTS: frozenset[Constraint] = frozenset({accumulator_fits_registers, smem_fits, tma_box_fits})


def check_problem(problem: Problem) -> None:
    if problem.lhs_dtype != problem.rhs_dtype or problem.lhs_dtype not in ("bfloat16", "float16"):
        raise Unsupported(
            f"mosaic_gpu's weight gradient needs bfloat16 or float16 lhs and dout of one dtype, not "
            f"lhs={problem.lhs_dtype} dout={problem.rhs_dtype}"
        )
    # Any tile takes a partial last one (kernel_drhs), but Mosaic GPU tiles the global arrays by the
    # swizzled tiles, whose rows narrow to what the sides divide, 32 bytes at the narrowest.
    granule = tiling.DRHS_GRANULE
    if problem.k % granule or problem.n % granule:
        raise Unsupported(
            f"K={problem.k} and N={problem.n} must be multiples of {granule} (the swizzled tiles)"
        )


def expected_steps(problem: Problem, config: MosaicGpuConfig) -> float:
    """Contraction steps of a touched expert under uniform routing (never fewer than one). One warpgroup
    steps through block_m-aligned blocks: r rows from a random start span r / block_m + 1 of them on
    average. A producer warpgroup starts at the expert's first row rounded down to 8 (3.5 rows early on
    average), and the last step is half used on average."""
    rows = cost.uniform_routing(problem).rows
    if config.warp_specialized:
        return max(1.0, (rows + 3.5) / config.block_m + 0.5)
    return max(1.0, rows / config.block_m + 1.0 - 1.0 / config.block_m)


@dataclasses.dataclass(frozen=True, slots=True)
class Estimate:
    seconds: float
    compute_s: float
    hbm_s: float
    items: float


def operand_traffic(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> float:
    """HBM bytes of the operands a touched expert's tiles read, summed over the touched experts: each
    strip of `grid_tile_width` tiles along P ("m") reads the expert's whole b operand (dout; lhs under
    transpose_rhs), along Q ("n") its whole a operand, unless that operand fits in half the L2, where it
    stays between strips; the strip's own tiles of the other operand stay in L2 as it is walked."""
    routing = cost.uniform_routing(problem)
    t = tiling.drhs_tiles(problem.k, problem.n, problem.transpose_rhs, config)
    item = tiling.itemsize(problem.lhs_dtype)
    a_bytes, b_bytes = routing.rows * t.p * item, routing.rows * t.q * item
    l2 = hardware.facts(device.compute_capability).l2_bytes_fallback
    strips_p = math.ceil(t.p / t.tile_p / config.grid_tile_width)
    strips_q = math.ceil(t.q / t.cta_q / config.grid_tile_width)
    if config.grid_minor_dim == "m":
        per_expert = a_bytes + b_bytes * (1 if b_bytes <= l2 / 2 else strips_p)
    else:
        per_expert = b_bytes + a_bytes * (1 if a_bytes <= l2 / 2 else strips_q)
    return per_expert * routing.experts


def smem_bytes_per_item(problem: Problem, config: MosaicGpuConfig) -> float:
    """Bytes an item of the chained pipeline moves through its SM's shared memory: the operand copies in,
    the wgmmas' operand reads (each consumer reads the a tile once and its half of the b tile once per
    64-row slice of its accumulator), the zeroing of the edge steps' b tile (read and written back), and
    the output tile written and read out by the store. At 100-200 rows per expert this port, not the
    tensor cores, bounds the item (DeepSeek-V3's weight gradient at T=4096 on the H200: 616 KB an item,
    3.2 us at 128 bytes a clock, against 3.1 us measured)."""
    t = tiling.drhs_tiles(problem.k, problem.n, problem.transpose_rhs, config)
    in_bytes, out_bytes = tiling.itemsize(problem.lhs_dtype), tiling.itemsize(problem.out_dtype)
    steps, step = expected_steps(problem, config), config.block_m
    copies = step * (t.tile_p + t.cta_q)
    reads = t.consumers * step * (t.tile_p + t.tile_p // 64 * t.tile_q)
    zeroing = min(2.0, steps) * 2 * step * t.cta_q
    return (steps * (copies + reads) + zeroing) * in_bytes + 2 * t.tile_p * t.cta_q * out_bytes


def estimate(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> Estimate:
    """The cost model of the module docstring (uniform routing)."""
    facts = hardware.facts(device.compute_capability)
    clock = facts.sustained_clock_hz
    t = tiling.drhs_tiles(problem.k, problem.n, problem.transpose_rhs, config)
    in_bytes, out_bytes = tiling.itemsize(problem.lhs_dtype), tiling.itemsize(problem.out_dtype)
    efficiency = SPECIALIZED_EFFICIENCY if config.warp_specialized else PLAIN_EFFICIENCY
    mma_s = 2 * config.block_m * t.tile_p * t.cta_q / (facts.mma_flops_per_clock * clock * efficiency)
    copy_s = config.block_m * (t.tile_p + t.cta_q) * in_bytes / (facts.sm_port_bytes_per_clock * clock)
    steps = expected_steps(problem, config)
    edge_s = min(2.0, steps) * 2 * config.block_m * t.tile_q * in_bytes / (facts.smem_bytes_per_clock * clock)
    store_s = t.tile_p * t.cta_q * out_bytes / (facts.sm_port_bytes_per_clock * clock)
    # A persistent CTA's store drains under its next item; a CTA of its own pays for the drain, its start
    # and its exit. With a producer warpgroup one pipeline spans all of a persistent CTA's items, so only
    # the CTA's first item waits for its tiles and the consumers' own cost is the output tile's write to
    # shared memory; one warpgroup starts each item's pipeline empty.
    chained = config.warp_specialized and config.persistent
    tile_write_s = t.tile_p * t.cta_q * out_bytes / (facts.smem_bytes_per_clock * clock)
    item_s = steps * max(mma_s, copy_s) + edge_s + (tile_write_s if chained else facts.memory_latency_s)
    if chained:
        # The consumers hold two slots (the wgmma in flight and the one being issued): with two stages the
        # producer has none to fill ahead, and each step's copy runs after the step before it.
        if config.max_concurrent_steps <= 2:
            item_s += steps * copy_s
        item_s = max(item_s, smem_bytes_per_item(problem, config) / (facts.smem_bytes_per_clock * clock))
    if not config.persistent:
        item_s += store_s + CTA_ITEM_S
    touched = cost.uniform_routing(problem).experts
    items = touched * t.tiles_per_expert
    empty_items = (problem.g - touched) * t.tiles_per_expert
    waves = math.ceil(items / device.core_count) if config.persistent else items / device.core_count
    compute_s = waves * item_s + empty_items * (store_s + facts.memory_latency_s) / device.core_count
    if chained:
        compute_s += facts.memory_latency_s
    out_traffic = problem.g * problem.k * problem.n * out_bytes
    hbm_rate = hardware.hbm_bytes_per_s(device.device_kind, device.compute_capability)
    hbm_s = (operand_traffic(problem, config, device) + out_traffic) / hbm_rate
    seconds = max(compute_s, hbm_s) + cost.LAUNCH_S + PROLOGUE_S
    return Estimate(seconds=seconds, compute_s=compute_s, hbm_s=hbm_s, items=items)


def space(problem: Problem, device: DeviceFingerprint) -> SearchSpace:
    return SearchSpace(
        MosaicGpuConfig,
        dict(DOMAINS),
        CONSTRAINTS,
        seeding=functools.partial(preferred, problem, device),
        validity=VALIDITY_CONSTRAINTS,
    )


@functools.lru_cache(maxsize=512)
def ranking(problem: Problem, device: DeviceFingerprint) -> tuple[tuple[MosaicGpuConfig, Estimate], ...]:
    """Every admitted config of the space with its estimate, best first. Estimates within TIE of each
    other count as equal, the model being no finer than that: among them the larger output tile wins (a
    tile is fewer items, each with its fixed costs the model leaves out, and fewer operand bytes per
    FLOP), then the deeper pipeline."""
    if isinstance(arch_facts(device), str):
        return ()
    search = SearchSpace(MosaicGpuConfig, dict(DOMAINS), CONSTRAINTS)
    configs, _ = search.enumerate(problem, device)
    rows = [(config, estimate(problem, config, device)) for config in configs]
    size = lambda c: c.block_k * c.block_n * c.consumers  # noqa: E731
    rows.sort(key=lambda r: r[1].seconds)
    best = rows[0][1].seconds if rows else 1.0
    bucket = lambda e: math.floor(math.log(e.seconds / best) / math.log1p(TIE))  # noqa: E731
    rows.sort(key=lambda r: (bucket(r[1]), -size(r[0]), -r[0].max_concurrent_steps, r[1].seconds))
    return tuple(rows)


def preferred(problem: Problem, device: DeviceFingerprint) -> list[MosaicGpuConfig]:
    """A sweep's seeds: the best-ranked config of each of the SEEDS best tile shapes."""
    seeds: dict[tuple, MosaicGpuConfig] = {}
    for config, _ in ranking(problem, device):
        seeds.setdefault(
            (config.block_m, config.block_k, config.block_n, config.wg_split, config.warp_specialized), config
        )
        if len(seeds) == SEEDS:
            break
    return list(seeds.values())


# Valid wherever check_problem() accepts: K and N multiples of 16, 16-bit operands.
ALWAYS_VALID = MosaicGpuConfig(
    block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, warp_specialized=False, wg_split="none"
)


def heuristic(problem: Problem, device: DeviceFingerprint) -> MosaicGpuConfig:
    return next(iter(preferred(problem, device)), ALWAYS_VALID)
