"""A cost model of the mosaic_gpu grouped GEMM: the seconds a config should take on a device, from the
bytes it streams, the FLOPs its tiles multiply, how its work items spread over the SMs and the
hardware facts of kernels/backends/mosaic_gpu/hardware.py (SM count from the device fingerprint). The
heuristic ranks a family of configs by it (`ranked`) instead of looking sweep winners up.

The model, per config:
  routing    M rows spread at random, uniformly, over G experts: E = G (1 - (1 - 1/G)^M)
             experts have rows, r = M / E rows each, and each takes about cdiv(r + 3.5, cta_m) row tiles
             (its rows start anywhere in a window aligned to 8).
  items      row tiles x column tiles x K splits, run in waves of one per CTA slot (SMs x resident
             CTAs); an SM's share is ceil(items / SMs).
  the kernel wave by wave. In a full wave an SM's items take the longest of: their share of the HBM
             bytes at the part's bandwidth and of the operand copies at L2's, their FLOPs at the tensor
             cores' rate (these three combined smoothly: two near their limit cost more than one), and
             their bytes at the SM's own stream. The last wave's few items share the bandwidths among
             fewer SMs and run at what their own bytes in flight sustain: 133 items on 132 SMs cost one
             wave plus one latency-bound item, not 133/132 of a wave. Plus per item what a pipeline
             cannot hide: the first stage's latency (half hidden by a chained persistent pipeline or by
             other CTAs resident on the SM), the tile lookup (the table's one row) and the epilogue; and
             the walk's pass over all G groups, which nothing hides.
  bandwidth  all items' bytes: HBM (each touched expert's weights once per strip of row tiles that reads
             them, as the tile order allows) and L2 -> shared memory (every item's operand tiles); one
             SM streams at most its bytes in flight (resident CTAs x stages x stage bytes) per memory
             latency (Little's law), and at most its port's bytes per clock.
  tensor     a wgmma m64nNk16 reads A (64 x 16) and B (16 x N) from shared memory: with a narrow N (the
             8-64 tokens of swap_ab) the shared-memory reads, not the FLOPs, bound it. FP8 runs twice
             the FLOPs per clock; under block scales the tensor cores also wait, each K step, for every
             accumulator value's promotion on the CUDA cores, padding rows included (a plain warpgroup
             issues no copies meanwhile).
  fixed      the launch, the row-tile table's XLA prologue, split-K's reduction, pad_lhs's copy.

The fitted constants come from the part's calibration file (calibration.py), which holds the
measurements each one was fitted to; the device benchmark (lab/device/finegrained.sh) records what each
config takes beside its estimate, so that they can be refitted. What the model leaves out: skewed
routing (it plans for balanced rows), L2 capacity beyond one strip's reuse, instruction-cache pressure
of the walk at large G (the space prunes the walk there instead), and power throttling beyond the
sustained clock.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

from moetune.kernels.backends.mosaic_gpu import calibration, hardware, tiling
from moetune.kernels.backends.mosaic_gpu.config import WGMMA_M, MosaicGpuConfig
from moetune.kernels.backends.mosaic_gpu.schedule import ROW_ALIGN
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.problem import Problem

# Fitted constants come from the part's calibration file (calibration/nvidia_h200.json beside this module:
# each one's value, the measurements it was fitted to and its fit, or why it has none); a Hopper part
# without a file of its own plans with the H200's. tests/kernels/backends/mosaic_gpu/test_calibration.py
# re-derives each fitted one from its measurements.
_CALIBRATION = calibration.load()
LAUNCH_S = _CALIBRATION.value("LAUNCH_S")  # a kernel's launch and ramp as CUPTI times it
PROLOGUE_S = _CALIBRATION.value("PROLOGUE_S")  # the row-tile table's XLA fusions (cumulative sums, a count)
REDUCTION_S = _CALIBRATION.value("REDUCTION_S")  # split-K's XLA sum, beyond its bytes
PAD_S = _CALIBRATION.value("PAD_S")  # pad_lhs's XLA copy, beyond its bytes
# One group of the walk: a chain of dependent loads and integer ops, not the few ns of its arithmetic alone
# (fitted to the same config under the walk and the table).
WALK_S_PER_GROUP = _CALIBRATION.value("WALK_S_PER_GROUP")
EPILOGUE_S = _CALIBRATION.value("EPILOGUE_S")  # an item's store: barrier, TMA issue and the wait for the slot
CTA_S = _CALIBRATION.value("CTA_S")  # a CTA's start and exit in a grid of one CTA per item
WGMMA_ISSUE_CYCLES = _CALIBRATION.value("WGMMA_ISSUE_CYCLES")
PLAIN_MMA_EFFICIENCY = _CALIBRATION.value("PLAIN_MMA_EFFICIENCY")
# Two consumers splitting a CTA tile's rows (wg_split "m") against two splitting its columns: the M split
# was slower on most same-tile pairs of compute-bound development shapes, worst on DeepSeek-V3's gate_up,
# and the model cannot tell which pairs lose. The handicap lets the M split win only by a clear estimated
# margin. Cause not isolated (docs/performance.md).
M_SPLIT_MMA_EFFICIENCY = _CALIBRATION.value("M_SPLIT_MMA_EFFICIENCY")
# FP8 block scales: after each K step's wgmmas a consumer waits for them (STEP_WAIT_S a step), then
# promotes every accumulator value of each of the step's scale blocks into the float32 total (a
# multiply-add and a reset on the CUDA cores, which issue LANE_OPS_PER_CLOCK a clock per SM: PROMOTE_OPS
# lane-ops per value, TALL_PROMOTION times that for consumers of two wgmma row tiles, cause not isolated).
# A CTA's consumers wait on the same stages, so they promote at once and the tensor cores idle meanwhile.
PROMOTE_OPS = _CALIBRATION.value("PROMOTE_OPS")
LANE_OPS_PER_CLOCK = 128
TALL_PROMOTION = _CALIBRATION.value("TALL_PROMOTION")
# Staggered consumers (stagger_consumers) take turns at the tensor cores, so that each promotes its half
# while the other's wgmmas run: at best a step takes max(T, (T + P) / 2) for wgmmas T and promotions P,
# not T + P. The share of that saving the model credits (0 until a staggered kernel is timed).
STAGGER_HIDDEN = _CALIBRATION.value("STAGGER_HIDDEN")
STEP_WAIT_S = _CALIBRATION.value("STEP_WAIT_S")
# lhs rows past its end that TMA zero-fills, against rows it copies from L2.
ZERO_FILL_COST = _CALIBRATION.value("ZERO_FILL_COST")
SMOOTH_MAX_POWER = _CALIBRATION.value("SMOOTH_MAX_POWER")
# Near-ties go to the earlier config of the family (the measured preference that the family's order
# encodes): the model cannot tell configs apart that closely.
TIE = _CALIBRATION.value("TIE")


@dataclasses.dataclass(frozen=True, slots=True)
class Routing:
    experts: float  # experts with at least one row
    rows: float  # rows of each of them


def uniform_routing(problem: Problem) -> Routing:
    g, m = problem.g, problem.m
    touched = g * (1.0 - (1.0 - 1.0 / g) ** m) if g > 1 else 1.0
    return Routing(experts=touched, rows=m / touched)


def row_tiles_per_expert(rows: float, cta_m: int) -> float:
    """Expected row tiles of an expert of `rows` rows: its first row lies 3.5 rows past an 8-aligned
    window start on average, and past one window the last one is half full on average."""
    windows = (rows + 3.5) / cta_m
    return 1.0 if windows <= 1 else windows + 0.5


@dataclasses.dataclass(frozen=True, slots=True)
class Estimate:
    seconds: float
    items: float  # work items with rows
    sms: int  # SMs that get work
    ctas_per_sm: int  # CTAs resident on one SM
    item_s: float  # one item's time on an SM, its share of the stream included
    fixed_s: float  # launch, prologue, reductions and copies outside the kernel


def mma_efficiency(config: MosaicGpuConfig, facts: hardware.ArchFacts) -> float:
    """Fraction of the tensor cores' FLOP rate a consumer's wgmmas reach: an m64nNk16 instruction takes
    the longer of its FLOPs and its shared-memory reads of A and B (N is the token rows under swap_ab)."""
    n = config.block_m if config.swap_ab else config.block_n
    flop_cycles = 2 * WGMMA_M * n * 16 / facts.mma_flops_per_clock
    smem_cycles = (WGMMA_M * 16 + 16 * n) * 2 / facts.smem_bytes_per_clock
    efficiency = flop_cycles / (max(flop_cycles, smem_cycles) + WGMMA_ISSUE_CYCLES)
    if not config.warp_specialized:
        return efficiency * PLAIN_MMA_EFFICIENCY
    return efficiency * (M_SPLIT_MMA_EFFICIENCY if config.wg_split == "m" else 1.0)


def mma_rate_factor(problem: Problem) -> float:
    """The tensor cores' rate on the problem's operands against 16-bit ones: FP8 wgmma (m64nNk32) does
    twice the FLOPs per clock from the same shared-memory bytes."""
    return 2.0 if tiling.itemsize(problem.lhs_dtype) == 1 else 1.0


def promotion_s(problem: Problem, config: MosaicGpuConfig, geo: tiling.TileGeometry, clock: float) -> float:
    """What FP8 block scales add to one item's multiplies: every K step's wait, and each scale block's
    promotion of the item's accumulator values (both weight tiles' under SwiGLU); none for other ops."""
    if problem.scale_layout != tiling.BLOCK_SCALE_LAYOUT:
        return 0.0
    values = geo.cta_m * geo.cta_n * tiling.weight_tiles(problem)
    blocks = geo.k_steps * tiling.scale_blocks(problem, config)
    acc_rows = config.block_n if config.swap_ab else config.block_m  # a consumer's accumulator rows
    ops = PROMOTE_OPS * (TALL_PROMOTION if acc_rows > WGMMA_M else 1.0)
    return values * blocks * ops / (LANE_OPS_PER_CLOCK * clock) + geo.k_steps * STEP_WAIT_S


def multiply_s(config: MosaicGpuConfig, mma_s: float, promote_s: float) -> float:
    """An item's tensor-core time `mma_s` and its promotions `promote_s` (promotion_s): one after the
    other, or under stagger_consumers overlapped by STAGGER_HIDDEN of what the turns can hide."""
    serial = mma_s + promote_s
    if not config.stagger_consumers:
        return serial
    overlapped = max(mma_s, serial / 2)
    return serial - STAGGER_HIDDEN * (serial - overlapped)


def resident_ctas(problem: Problem, config: MosaicGpuConfig, facts: hardware.ArchFacts) -> int:
    """CTAs one SM holds at once. Persistent grids run one per SM. Warp-specialized kernels take the
    register file (setmaxnreg), so one; a plain warpgroup's share is its accumulator plus the rest."""
    if config.persistent or config.warp_specialized:
        return 1
    by_smem = facts.smem_per_sm // tiling.smem_bytes(problem, config)
    registers = 128 * (tiling.accumulator_registers(config, tiling.accumulators(problem, config)) + 40)
    return max(1, min(by_smem, facts.registers_per_sm // registers))


def _reread(order: str, width: int, tiles: float) -> float:
    """HBM reads of one expert's column tile, over its `tiles` row tiles: a strip of `width` row tiles
    reads it once; the "m" order's strips also cut across experts, so an expert spans one more."""
    if tiles <= 1:
        return 1.0
    if order == "n":
        return 1.0  # down every row tile of a column strip: the expert's rows are consecutive
    strips = tiles / width
    return min(tiles, max(1.0, strips) if order == "expert" else strips + 1.0)


def _smooth_max(*times: float) -> float:
    """max(times) raised where several come close (an L6 norm: two equal ones cost 12% more)."""
    return sum(t**SMOOTH_MAX_POWER for t in times) ** (1 / SMOOTH_MAX_POWER)


def estimate(problem: Problem, config: MosaicGpuConfig, device: DeviceFingerprint) -> Estimate:
    """The model's seconds for `config` on `problem` (see the module docstring): the kernel takes the
    longest of its HBM bytes at the part's bandwidth, its operand copies at L2's, the busiest SM's
    items at the tensor cores' rate or at the stream its bytes in flight sustain; plus what pipelines
    cannot hide per item, the grid's idle items and the work outside the kernel."""
    facts = hardware.facts(device.compute_capability)
    bandwidth = hardware.hbm_bytes_per_s(device.device_kind, device.compute_capability)
    clock = facts.sustained_clock_hz
    geo = tiling.geometry(problem, config)
    weight_tiles = tiling.weight_tiles(problem)
    in_bytes = tiling.itemsize(problem.lhs_dtype)
    route = uniform_routing(problem)

    per_expert = row_tiles_per_expert(route.rows, geo.cta_m)
    items = route.experts * per_expert * geo.col_tiles * geo.split_k
    resident = resident_ctas(problem, config, facts)
    busy = max(1, min(device.core_count, math.ceil(items / resident)))
    per_sm = math.ceil(items / busy)  # items on the busiest SM

    # HBM: each touched expert's weights once per strip that reads them, lhs once, the output once.
    reread = _reread(config.grid_minor_dim, config.grid_tile_width, per_expert)
    hbm = route.experts * problem.k * problem.n * in_bytes * reread
    hbm += problem.m * problem.k * in_bytes + problem.m * problem.out_n * geo.out_itemsize * geo.split_k
    # L2 -> shared memory: every item's lhs and weight tiles; TMA's zero fill of lhs rows past its end
    # (a decode-sized lhs without pad_lhs) costs more than reading rows.
    k_len = problem.k / geo.split_k
    past_end = geo.cta_m - problem.m if problem.m < geo.cta_m and not config.pad_lhs else 0
    lhs_rows = geo.cta_m - past_end + past_end * ZERO_FILL_COST
    item_bytes = (lhs_rows + weight_tiles * geo.cta_n) * k_len * in_bytes
    # A partial last K step or column tile: the operands past K and N are zero-filled, not read, and
    # the tile multiplies them all the same (whole steps and tiles below).
    k_run = geo.k_steps * config.block_k  # the K one item multiplies over, its last step's fill included
    cols = problem.out_n / geo.col_tiles  # output columns of an average column tile
    if k_run != k_len or cols != geo.cta_n:
        filled = (geo.cta_m + weight_tiles * geo.cta_n) * (k_run - k_len)
        filled += weight_tiles * (geo.cta_n - cols) * k_len
        item_bytes = ((lhs_rows + weight_tiles * cols) * k_len + filled * ZERO_FILL_COST) * in_bytes
    stage_bytes = (geo.cta_m + weight_tiles * geo.cta_n) * config.block_k * in_bytes

    # One item's multiplies: whole windows of rows (the tokens exactly under swap_ab), whole K steps.
    flops = 2 * geo.cta_m * geo.cta_n * k_run * weight_tiles
    mma_rate = facts.mma_flops_per_clock * mma_rate_factor(problem) * clock * mma_efficiency(config, facts)
    # Waves of `resident` items on each busy SM. In a full wave an SM's items take its share of the
    # shared bandwidths (HBM, L2), their FLOPs at the tensor cores' rate (two near their limit at once
    # cost more than either) or their bytes at the SM's stream (Little's law on its bytes in flight).
    # The last wave's items share the bandwidths among fewer CTAs, so that a lone one runs at what its
    # own bytes in flight sustain: 133 items on 132 SMs cost one wave plus one latency-bound item.
    promote = promotion_s(problem, config, geo, clock)
    # A plain warpgroup issues its own copies between its wgmmas: while it waits and promotes it issues
    # none, so its stream stops for that long (a producer warpgroup keeps streaming instead).
    stalled = 0.0 if config.warp_specialized else promote
    port = facts.sm_port_bytes_per_clock * clock
    cta_in_flight = geo.stages * stage_bytes

    def wave(n: float, per_sm_items: int) -> float:
        stream = min(per_sm_items * cta_in_flight / facts.memory_latency_s, port)
        stall = per_sm_items * stalled
        shared = (hbm / bandwidth * n / items + stall, item_bytes * n / facts.l2_bytes_per_s)
        multiply = per_sm_items * multiply_s(config, flops / mma_rate, promote)
        return max(_smooth_max(*shared, multiply), per_sm_items * item_bytes / stream + stall)

    slots = busy * resident
    waves = math.ceil(items / slots)
    last = items - (waves - 1) * slots
    kernel = (waves - 1) * wave(slots, resident) + wave(last, math.ceil(last / busy))

    # What an item's pipeline cannot overlap: the first stage's latency, the tile lookup and the
    # epilogue, half hidden by a chained pipeline or by other CTAs resident on the SM.
    chained = config.warp_specialized and config.persistent and geo.k_steps % geo.stages == 0
    table = config.tile_schedule == "table"
    expert_order = config.grid_minor_dim == "expert"
    lookup = facts.memory_latency_s / 2 * (2 if table and expert_order else 1)
    epilogue = EPILOGUE_S + geo.cta_m * geo.cta_n * geo.out_itemsize / (clock * facts.smem_bytes_per_clock)
    exposed = (0.5 if chained or resident > 1 else 1.0) * (facts.memory_latency_s + lookup + epilogue)
    # The walk: a chain of dependent steps per group that each warpgroup runs before its tile (the
    # consumers need its rows for the epilogue), so no pipeline of its own hides it; in a grid of one
    # CTA per item the other CTAs resident on the SM stream meanwhile, as they do past idle items.
    walk = 0.0 if table or resident > 1 else WALK_S_PER_GROUP * (problem.g + 1) * (2 if expert_order else 1)
    exposed += walk
    if not config.persistent:
        exposed += CTA_S / resident
    item_s = kernel / per_sm + exposed

    # Items the static grid carries beyond the real ones: the walk visits each (a persistent loop looks
    # them up, a grid of one CTA per item starts a CTA for each); the table's persistent loop stops at
    # the real ones.
    idle = 0.0 if table and config.persistent else max(0.0, geo.tiles - items)
    idle_s = idle / (device.core_count * resident) * ((0.0 if config.persistent else CTA_S) + lookup + walk)

    fixed = LAUNCH_S + (PROLOGUE_S if table else 0.0)
    if config.split_k > 1:
        partials = config.split_k * problem.m * problem.out_n * 4 + problem.m * problem.out_n * 2
        fixed += REDUCTION_S + partials / bandwidth
    if config.pad_lhs and problem.m <= geo.cta_m:
        fixed += PAD_S + 2 * (geo.cta_m + ROW_ALIGN) * problem.k * in_bytes / bandwidth
    return Estimate(
        seconds=fixed + per_sm * item_s + idle_s,
        items=items,
        sms=busy,
        ctas_per_sm=resident,
        item_s=item_s,
        fixed_s=fixed,
    )


# --- The family the heuristic ranks -------------------------------------------------------------------

# Tile shapes (block_m, block_n, wg_split, warp_specialized), normal orientation. Their order is the
# measured preference among near-ties (H200, lab/README.md): the 128x256 CTA of two 128x128
# consumers won most prefill rows, 64x256 plain one CTA per tile most decode rows.
_TILES = (
    (128, 128, "n", True),
    (64, 256, "m", True),
    (128, 64, "n", True),
    (64, 128, "m", True),
    (64, 128, "n", True),
    (64, 64, "n", True),
    (64, 256, "none", False),
    (64, 128, "none", False),
    (64, 64, "none", False),
    (128, 128, "none", True),
)
# 64-column CTAs with a producer, ranked only where the output's width is no multiple of 128 (gpt-oss's
# 2880): every wider CTA above then has a partial last column tile, whose zero-filled columns it multiplies.
_NARROW_TILES = ((64, 64, "m", True), (128, 64, "none", True))
# swap_ab tile shapes: token rows (wgmma's N) x weight columns.
_SWAPPED_ROWS = (8, 16, 32)
_SWAPPED_TILES = ((128, "none", False), (64, "none", False), (64, "n", True), (128, "n", True))
_SPLITS = (1, 2, 4, 8)
MAX_STAGES = 6
# Under the SwiGLU epilogue the expert order paid off up to 1024 rows per expert and not above: in an H200
# sweep of Mixtral's gate_up (same config in both orders, same run; balanced and Zipf routing) it took
# 0.922-1.009x the "m" order's time at M=1024-8192 (6 of 9 pairs faster) and 1.012-1.048x at M=16384-32768
# (all 4 slower; lab/README.md). For the plain GEMM it was up to 12.6% faster under Zipf routing and
# within 1% under balanced routing.
SWIGLU_EXPERT_ORDER_MAX_ROWS = 1024
# Few rows per expert: at most one 64-row wgmma tile's. Memory-bound; the space narrows its domains and
# offers swap-AB tiles there.
FEW_ROWS = WGMMA_M


def _orders(problem: Problem, route: Routing) -> tuple[tuple[str, int], ...]:
    """Tile orders worth ranking. With few rows per expert (one row tile each) every order reads each
    weight once (they differ only in which CTAs start first): one. With more: one expert's tiles at a
    time ("expert") or strips of 8 row tiles ("m"), "expert" first but for SwiGLU above
    SWIGLU_EXPERT_ORDER_MAX_ROWS rows per expert."""
    if route.rows <= FEW_ROWS:
        return (("m", 1),)
    if tiling.weight_tiles(problem) == 2 and problem.m / problem.g > SWIGLU_EXPERT_ORDER_MAX_ROWS:
        return (("m", 8), ("expert", 8))
    return (("expert", 8), ("m", 8))


def _stage_options(problem: Problem, base: MosaicGpuConfig, facts: hardware.ArchFacts) -> list[int]:
    """The deepest pipeline that fits one CTA's shared memory, and for a plain grid of one CTA per item
    also the deepest that lets two CTAs share an SM."""
    steps = tiling.geometry(problem, base).k_steps
    smem = {s: tiling.smem_bytes(problem, base, s) for s in range(2, min(MAX_STAGES, max(2, steps)) + 1)}
    fits = [s for s, need in smem.items() if need <= facts.smem_per_block]
    shared = [s for s in fits if 2 * smem[s] <= facts.smem_per_sm]
    options = fits[-1:]
    if not base.persistent and not base.warp_specialized and shared and shared[-1] not in options:
        options.append(shared[-1])
    return options


def _shapes(problem: Problem, route: Routing) -> list[dict]:
    """Tile shapes to rank: the normal ones (and the narrow ones where the width needs them), then
    while an expert's rows fit them the swapped ones (narrowest first that holds its rows). Measured
    shapes first: near-ties go to them."""
    tiles = _TILES + (_NARROW_TILES if problem.out_n % 128 else ())
    normal = [dict(block_m=bm, block_n=bn, wg_split=sp, warp_specialized=ws) for bm, bn, sp, ws in tiles]
    if route.rows > FEW_ROWS:
        return normal
    rows = [r for r in _SWAPPED_ROWS if r >= route.rows] or [_SWAPPED_ROWS[-1]]
    swapped = [
        dict(block_m=r, block_n=bn, wg_split=sp, warp_specialized=ws)
        for r in rows
        for bn, sp, ws in _SWAPPED_TILES
    ]
    return normal + swapped


def family(problem: Problem, device: DeviceFingerprint, domains: dict[str, tuple]) -> list[MosaicGpuConfig]:
    """Configs the heuristic ranks, in order of measured preference, before any constraint: tile shapes,
    the K steps and tile schedules of the problem's space (`domains`; widest K step first), grid kind,
    split-K at small M (not under swap_ab), tile orders, pad_lhs where M fits a tile, pipeline depths
    from shared memory, and where the domains offer them staggered consumers."""
    facts = hardware.facts(device.compute_capability)
    route = uniform_routing(problem)
    splits = tuple(s for s in _SPLITS if s == 1 or problem.m <= 512)
    pads = (False, True) if problem.m <= tiling.TMA_BOX_MAX else (False,)
    block_ks = sorted(domains["block_k"], reverse=True)
    out: list[MosaicGpuConfig] = []
    for shape, block_k, persistent, split_k, schedule, pad in itertools.product(
        _shapes(problem, route), block_ks, (True, False), splits, domains["tile_schedule"], pads
    ):
        swapped = shape["block_m"] < WGMMA_M
        if (split_k > 1 and swapped) or (pad and problem.m > shape["block_m"]):
            continue
        for order, width in _orders(problem, route):
            base = MosaicGpuConfig(
                **shape,
                block_k=block_k,
                max_concurrent_steps=2,
                persistent=persistent,
                split_k=split_k,
                grid_minor_dim=order,
                grid_tile_width=width,
                tile_schedule=schedule,
                pad_lhs=pad,
                epi_tile_n=64,
            )
            # Staggered consumers after lockstep ones: a tie keeps the lockstep config.
            staggers = domains["stagger_consumers"] if base.consumers == 2 else (False,)
            out += [
                dataclasses.replace(base, max_concurrent_steps=s, stagger_consumers=stagger)
                for s in _stage_options(problem, base, facts)
                for stagger in sorted(staggers)
            ]
    return out


def ranked(
    problem: Problem, configs: list[MosaicGpuConfig], device: DeviceFingerprint, top: int = 8
) -> list[tuple[MosaicGpuConfig, Estimate]]:
    """`configs` with their estimates, best first. Each of the first `top` places goes to the earliest
    config (in the order of `configs`) estimated within TIE of the fastest one left: the model cannot
    tell configs apart that closely, and the family's order is the measured preference. The rest
    follow by estimate."""
    left = [(c, estimate(problem, c, device)) for c in configs]
    picked = []
    for _ in range(min(top, len(left))):
        fastest = min(e.seconds for _, e in left)
        i = next(i for i, (_, e) in enumerate(left) if e.seconds <= fastest * (1 + TIE))
        picked.append(left.pop(i))
    return picked + sorted(left, key=lambda pair: pair[1].seconds)
