"""A cost model of the fused MoE decode block (kernel_decode.py, kernels/moe/decode_block.py): the seconds
each of its two kernels should take on a device, from the bytes of the touched experts' weights, the
weight bytes its programs keep in flight, and the routing every program of kernel 1 repeats.

At decode sizes the block reads each touched expert's weights once and multiplies 16-row tiles: it is
bound by how fast the weights stream, not by FLOPs. Per kernel:

  stream   the touched experts' weight bytes (kernel 1: [H, 2F] each, kernel 2: [F, H]) at the rate the
           programs in flight sustain: by Little's law, bytes in flight / memory latency, at most the HBM
           read rate. Each program keeps stages - 1 weight tiles in flight; programs in flight are the
           active ones, at most the SMs times the programs one SM holds (its warp slots, its shared memory
           for the pipeline's stages, its registers, and a cap of programs per SM). A tile whose rows
           are contiguous runs shorter than a cache line (128 bytes) fetches whole lines: the rate is
           scaled by the run's share of a line (the weight layout decides which tile width is the run).
  chain    one program's own chain, which no other program hides: kernel 1's routing, then its K steps
           (with up_programs, its share's steps, after finding the few slots the share spans),
           one memory latency per stages - 1 tiles; kernel 2's share of the (expert, F step) list the
           same way, plus the fixed-order meeting of down_split partial sums, a step taking at least
           the time its instructions take to issue where up_split's partials are added and the SwiGLU
           applied at every step (the SM's four schedulers shared by the programs on it). Programs past
           what the SMs hold run in further waves, each a chain.
  routing  kernel 1 only: every program routes the whole batch itself (top_k rounds of argmax over the
           [T, E] logits, or each expert's rank among its row's: kernel 1's docstring), so all programs'
           routing passes through the SMs' lanes; its reductions across warps lie on each chain (with
           a row per warp, route_warp_rows, argmax's stay inside a warp where a warp holds a row).
           A thread holds the [T, E] arrays across its warps' lanes; past its registers (the ISA's 255,
           or the SM's 65536 over the program's threads where fewer) they spill, and the routing slows
           by the excess.
  widen    FP8 weights only: every value is read into the dots in registers (kernels/moe/fp8_widen.py:
           widened to bf16 by conversion or by integer instructions, or to f16 with x's tile) on the
           SMs that run the kernel's programs, at the rates of the pipes its instructions use; kernel
           2's slowed by its registers' excess past a thread's (its accumulator and weight tile).
  a kernel takes its launch plus the largest of the four, plus kernel 1's routing where no weight
  streams meanwhile: every program routes before its first load, so the first wave's routing is
  exposed, and with one program per SM every wave's (nothing else on the SM streams meanwhile).

What it leaves out: the 16-row dots (a fraction of a step's load time at these sizes), the issue time of
every other step (a few hundred instructions a warp: lab/bench/decode_compile_report.py reads them from
the compiled kernels), x's and the hidden rows' reads (small, and from L2), skew in the routing (it plans
with uniform routing: the expected touched experts of kernels/ops/moe_decode_block.py), and the unfused
path it is compared with (a sweep times that: space_decode.BASELINE). Its constants are derived from the
kernels' code, the compiled kernels' instructions and the hardware facts, not fitted to timings: the
lab's block benchmark records what each config takes, from which a calibration of these constants would
be fitted as the GEMM model's are (calibration.py).
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

from moetune.kernels.backends.mosaic_gpu import hardware
from moetune.kernels.backends.mosaic_gpu.cost_model import LANE_OPS_PER_CLOCK, LAUNCH_S
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.moe.decode_block import (
    DOT_ROWS,
    DecodeConfig,
    rank_chunk,
    routing_rows,
    slots_per_share,
    split_steps,
    tiles,
)
from moetune.kernels.moe.pallas_mode import pow2_at_least
from moetune.kernels.ops.moe_decode_block import touched_experts
from moetune.kernels.problem import Problem

# An SM's warp slots (2048 threads) and the most programs (thread blocks) it holds at once: sm_90.
WARPS_PER_SM = 64
PROGRAMS_PER_SM = 32
# What a thread may hold in registers before the compiler spills (the ISA's limit per thread).
REGISTERS_PER_THREAD = 255
# A program's registers per thread beside its arrays: addresses, loop state, masks (not measured).
BASE_REGISTERS = 64
# Arrays of [T, E] elements a program of kernel 1 keeps live while it routes: the logits, their sort
# keys, the taken mask and the masked keys of the current round (route_in_kernel).
ROUTING_ARRAYS = 4
# Lane operations per [T, E] element and top-k round of route_in_kernel: the availability mask, the
# masked keys, the row max (a reduction), the tie compare, the index min (a reduction), the hit mask, the
# taken update, the value pick and its sum, and the slot writes of ids and values.
ROUTE_OPS_PER_ELEMENT = 12
# route_by_rank's lane operations per pair of a row's experts (two key compares, the index compare, an
# and, an or, the count's add) and per [T, E] element and top-k slot of its pick (a compare, an and, two
# selects and their sums).
RANK_OPS_PER_PAIR = 6
RANK_PICK_OPS = 6
# A reduction across a program's warps: five shuffles within each warp (~20 clocks each), then a
# shared-memory store, a barrier and a load (derived from that sequence, not measured). Argmax routing
# chains two per top-k round; rank routing one per chunk of experts and two for its pick; both a few more
# for the touched experts' scan.
REDUCTION_CLOCKS = 120
SCAN_REDUCTIONS = 4
# The same reduction within one warp (route_warp_rows, a row per warp): the shuffles alone. It stays in
# a warp only where a row fits one warp's lanes: 32 lanes of 16-byte vectors hold 128 float32 logits
# (compiled for sm_90a at one token: Qwen3-30B-A3B's 128 experts lose 39 of 59 barriers with a row per
# warp; DeepSeek-V3's 256 and Qwen3-Next's 512 gain some, their rows spanning warps still).
WARP_REDUCTION_CLOCKS = 100
WARP_ROW_VALUES = 128
# Lane operations of finding one work slot's expert (a compare, a select and a sum per expert, the sum a
# reduction across warps) and its tokens' weights (a compare, two selects and two sums per token and
# top-k choice): once per program in the grid of one program per unit, once per slot its share spans
# with up_programs (decode_block.slots_per_share), both before the loop.
SLOT_OPS_PER_EXPERT = 3
SLOT_OPS_PER_CHOICE = 5
# Kernel 2 with up_split > 1 adds the splits' float32 gate and up partials and applies the SwiGLU to each
# step's [rows, block_fd] hidden tile before its dot, and every warp computes the whole tile (the dot's
# operand layout gives each warp all of it): instructions per hidden element and lane of a warp, a fixed
# part (the SwiGLU, the conversion, the addresses) and a part per split (its two loads and adds). Fitted
# to instruction counts of compiled kernels' SASS, not to timings (lab/bench/decode_compile_report.py,
# Triton 3.6 for sm_90a: Qwen3-30B-A3B at one token, block_fd 128, 4 warps: 26.7 per element at two
# splits, 34.0 at four, the two points of the fit; gpt-oss-120b, block_fd 64 and 32, two splits: 26.8
# and 27.5, held out).
SWIGLU_INSTRUCTIONS = 19.4
PARTIAL_INSTRUCTIONS_PER_SPLIT = 3.66
# Kernel 2's registers per thread: a base, and per value of the [rows, block_h] accumulator (the step's
# product beside it, scaled and weighted before it is added) and of the [block_fd, block_h] weight tile
# that a thread holds. Fitted to ptxas's register counts of compiled kernels, not to timings
# (lab/bench/decode_register_fit.py: Qwen3-30B-A3B's kernel 2, block_h and block_fd 64, 128, 256 x 4 and
# 8 warps, at 8 and 32 tokens, every widening and 16-bit; the 119 of 126 below the ceiling, 19 registers
# rms, 49 at most). It finds the one shape that spills much: 256 x 256 tiles on 4 warps at 32 tokens
# (283; ptxas: 255 and 580 bytes spilled by f16, 24 by bits, none by convert).
DOWN_BASE_REGISTERS = 62.2
DOWN_ACCUMULATOR_REGISTERS = 2.303
DOWN_TILE_REGISTERS = 0.143
# Reading FP8 weight tiles into the dots (kernels/moe/fp8_widen.py, by mode), instructions per weight
# value from the compiled SASS: `convert` 1.5 conversions (an F2FP unpacking a pair to f16, an F2F per
# value to bf16); `f16` 0.5 (the F2FP alone) plus x's tile to f16, a conversion per pair of its values;
# `bits` 3 integer instructions (six a pair) and no conversion. The CUDA guide rates conversions at 16
# results a clock per SM (compute capability 9.0, "all other type conversions"), integer instructions at
# 64. From the compiled code and the guide's rates, not timed.
CONVERSIONS_PER_VALUE = {"convert": 1.5, "bits": 0.0, "f16": 0.5}
INTEGER_OPS_PER_VALUE = {"convert": 0.0, "bits": 3.0, "f16": 0.0}
CONVERSION_LANES_PER_CLOCK = 16
INTEGER_LANES_PER_CLOCK = 64
# The unit HBM reads through L2: a tile row's contiguous run shorter than this still costs a line.
LINE_BYTES = 128
# Lanes one warp scheduler issues a clock: a program of w warps issues min(w, 4) of an SM's 4 at most.
LANES_PER_SCHEDULER = 32
SCHEDULERS_PER_SM = 4


@dataclasses.dataclass(frozen=True, slots=True)
class KernelEstimate:
    seconds: float
    stream_s: float  # the weight bytes at the rate the programs in flight sustain
    chain_s: float  # one program's chain times the waves of programs
    route_s: float  # every program's routing through the SMs' lanes (kernel 1)
    programs: int  # the grid
    resident: int  # programs one SM holds at once
    exposed_s: float = 0.0  # kernel 1's routing while no weight streams (first wave, or every wave)
    widen_s: float = 0.0  # FP8 weights: every value widened on the SMs that run the programs

    @property
    def terms(self) -> tuple[float, float, float, float]:
        """The four limits, largest first: the runner-up says how much slack the bound leaves."""
        return tuple(sorted((self.stream_s, self.chain_s, self.route_s, self.widen_s), reverse=True))


@dataclasses.dataclass(frozen=True, slots=True)
class Estimate:
    seconds: float
    up: KernelEstimate
    down: KernelEstimate


def _itemsize(dtype: str) -> int:
    """Bytes per value: 1 for FP8 weights (moe_decode_block_fp8), which cross HBM and shared memory as
    they are and are widened to x's dtype in registers."""
    return jnp.dtype(dtype).itemsize


def pipeline_smem(problem: Problem, config: DecodeConfig) -> tuple[int, int]:
    """Shared memory per program of (kernel 1, kernel 2): Triton's pipeliner keeps stages - 1 buffers of
    every load in the loop (the byte counts of configs that failed to compile are exactly that), plus the
    float32 accumulators once for their layout conversion before the store. Kernel 1's loads are the
    gate and up weight tiles (in the weights' dtype: FP8 ones at a byte a value) and x's rows; kernel 2's
    the w_down tile and the hidden rows (x's dtype), which with up_split > 1 are the splits' float32 gate
    and up partial sums, up_split * 2 tiles of them."""
    item, x_item = _itemsize(problem.rhs_dtype), _itemsize(problem.lhs_dtype)
    rows = max(DOT_ROWS, pow2_at_least(problem.m))
    up_stage = (2 * config.block_f * item + rows * x_item) * config.block_k
    up = max(1, config.stages_up - 1) * up_stage + rows * 2 * config.block_f * 4
    hidden_tile = rows * config.block_fd * (x_item if config.up_split == 1 else 2 * config.up_split * 4)
    down_stage = config.block_h * config.block_fd * item + hidden_tile
    down = max(1, config.stages_down - 1) * down_stage + rows * config.block_h * 4
    return up, down


def register_ceiling(facts: hardware.ArchFacts, warps: int) -> int:
    """The registers a thread of a `warps`-warp program may hold before the compiler spills: the ISA's
    limit, or the SM's registers shared by the program's threads where that is less (16 warps on a
    Hopper SM: 65536 / 512 = 128, so a program of 16 warps spills what 4 warps would keep)."""
    return min(REGISTERS_PER_THREAD, facts.registers_per_sm // (32 * warps))


def _resident(facts: hardware.ArchFacts, warps: int, smem_bytes: int, registers: float) -> tuple[int, float]:
    """(programs one SM holds, the routing's slow-down from spilled registers)."""
    ceiling = register_ceiling(facts, warps)
    per_thread = min(registers, ceiling)
    by_registers = facts.registers_per_sm // max(1, math.ceil(per_thread) * 32 * warps)
    by_smem = facts.smem_per_sm // max(1, smem_bytes)
    resident = max(1, min(WARPS_PER_SM // warps, by_smem, by_registers, PROGRAMS_PER_SM))
    return resident, max(1.0, registers / ceiling)


def up_estimate(problem: Problem, config: DecodeConfig, device: DeviceFingerprint) -> KernelEstimate:
    """Kernel 1: gate_up and the SwiGLU, grid (min(T*k, E) slots, F / block_f, up_split), or up_programs
    programs each streaming a share of the (slot, F tile, K step) list."""
    facts = hardware.facts(device.compute_capability)
    clock, latency = facts.sustained_clock_hz, facts.memory_latency_s
    item = _itemsize(problem.rhs_dtype)
    tokens, hidden, inter, experts, top_k = problem.m, problem.k, problem.n // 2, problem.g, problem.top_k
    rows = max(DOT_ROWS, pow2_at_least(tokens))
    route_rows = routing_rows(tokens, config)
    routed = route_rows * pow2_at_least(experts)  # the [T, E] routing arrays, padded
    f_tiles = tiles(inter, config.block_f)
    items = touched_experts(problem) * f_tiles * config.up_split
    slots = min(tokens * top_k, experts)
    if config.up_programs:
        # Shares of the flat (slot, F tile, split, K step) list: each program routes once, finds the
        # few slots its share spans (each a reduction over E and a pass over its tokens' choices), and
        # streams ceil(items / programs) units' K steps.
        programs = config.up_programs
        active = min(programs, items)
        steps = math.ceil(items / programs) * split_steps(hidden, config.block_k, config.up_split)
        found = slots_per_share(slots, f_tiles * config.up_split, programs)
    else:
        programs = slots * f_tiles * config.up_split
        active = items
        steps = split_steps(hidden, config.block_k, config.up_split)
        found = 1
    choices = route_rows * pow2_at_least(top_k)
    slot_ops = found * (SLOT_OPS_PER_EXPERT * pow2_at_least(experts) + SLOT_OPS_PER_CHOICE * choices)
    tile = 2 * config.block_f * config.block_k * item  # a step's gate and up tiles
    smem = pipeline_smem(problem, config)[0]
    threads = 32 * config.warps_up
    registers = BASE_REGISTERS + (2 * rows * config.block_f + ROUTING_ARRAYS * routed) / threads
    resident, spill = _resident(facts, config.warps_up, smem, registers)
    in_flight = min(active, device.core_count * resident) * (config.stages_up - 1) * tile
    run = (config.block_k if problem.transpose_rhs else config.block_f) * item
    rate = min(_line_rate(device, run), in_flight / latency)
    stream_s = touched_experts(problem) * hidden * problem.n * item / rate
    in_warp = route_rows >= config.warps_up and pow2_at_least(experts) <= WARP_ROW_VALUES
    route_ops, reduction_clocks = _routing(route_rows, experts, top_k, config.route_by_rank, in_warp)
    route_ops *= spill
    lanes = min(config.warps_up, SCHEDULERS_PER_SM) * LANES_PER_SCHEDULER
    route_s = programs * route_ops / (device.core_count * LANE_OPS_PER_CLOCK * clock)
    routing = (route_ops + slot_ops) / (lanes * clock) + (reduction_clocks + found * REDUCTION_CLOCKS) / clock
    chain = routing + steps * latency / (config.stages_up - 1) + latency
    waves = math.ceil(programs / (device.core_count * resident))
    # Every program routes before its first weight load, so no weight streams while the first wave
    # routes; with one program per SM the same holds for every wave (an SM holds nothing else to
    # stream meanwhile), with more a later program routes while the SM's others stream.
    exposed = routing * (waves if resident == 1 else 1)
    values = touched_experts(problem) * hidden * problem.n
    widen_s = _widen_s(problem, values, config.widen_up, rows, 2 * config.block_f, active, device)
    return _kernel(stream_s, waves * chain, route_s, programs, resident, exposed, widen_s)


def _routing(rows: int, experts: int, top_k: int, by_rank: bool, in_warp: bool) -> tuple[float, float]:
    """(lane operations, clocks of the reductions in sequence) of one program's routing on `rows` rows;
    `in_warp`: argmax's reductions over E stay inside a warp (a row per warp that one warp holds)."""
    ep = pow2_at_least(experts)
    if not by_rank:
        over_e = WARP_REDUCTION_CLOCKS if in_warp else REDUCTION_CLOCKS
        clocks = 2 * top_k * over_e + SCAN_REDUCTIONS * REDUCTION_CLOCKS
        return top_k * rows * ep * ROUTE_OPS_PER_ELEMENT, clocks
    chunks = ep // rank_chunk(rows, ep)
    pick = rows * ep * pow2_at_least(top_k) * RANK_PICK_OPS
    return rows * ep * ep * RANK_OPS_PER_PAIR + pick, (chunks + 2 + SCAN_REDUCTIONS) * REDUCTION_CLOCKS


def down_estimate(problem: Problem, config: DecodeConfig, device: DeviceFingerprint) -> KernelEstimate:
    """Kernel 2: down and the weighted combine, grid (H / block_h, down_split); each program streams its
    share of the flat (touched expert, F step) list."""
    facts = hardware.facts(device.compute_capability)
    latency = facts.memory_latency_s
    item = _itemsize(problem.rhs_dtype)
    tokens, hidden, inter = problem.m, problem.k, problem.n // 2
    rows = max(DOT_ROWS, pow2_at_least(tokens))
    touched = touched_experts(problem)
    programs = tiles(hidden, config.block_h) * config.down_split
    share = math.ceil(touched * tiles(inter, config.block_fd) / config.down_split)
    tile = config.block_fd * config.block_h * item
    smem = pipeline_smem(problem, config)[1]
    accumulator, tile_values = down_thread_values(rows, config.block_h, config.block_fd, config.warps_down)
    registers = (
        DOWN_BASE_REGISTERS + DOWN_ACCUMULATOR_REGISTERS * accumulator + DOWN_TILE_REGISTERS * tile_values
    )
    resident, spill = _resident(facts, config.warps_down, smem, registers)
    in_flight = min(programs, device.core_count * resident) * (config.stages_down - 1) * tile
    run = (config.block_fd if problem.transpose_rhs else config.block_h) * item
    rate = min(_line_rate(device, run), in_flight / latency)
    stream_s = touched * inter * hidden * item / rate
    # Split programs of one H tile write float32 partial sums; the last to arrive (a counter, one more
    # latency) reads them back and adds them in split order.
    meeting = 2 * latency if config.down_split > 1 else 0.0
    # A step waits for its tile (the latency over the tiles in flight) or for its instructions to issue,
    # the SM's schedulers shared by the programs on it.
    together = min(resident, math.ceil(programs / device.core_count))
    step = max(latency / (config.stages_down - 1), together * _swiglu_issue_s(config, rows, facts))
    chain = latency + share * step + meeting
    waves = math.ceil(programs / (device.core_count * resident))
    # Past the thread's registers the excess values go to local memory and back every step: the work on
    # each weight value slows by the excess, as kernel 1's routing does.
    widen_s = spill * _widen_s(
        problem, touched * inter * hidden, config.widen_down, rows, config.block_h, programs, device
    )
    return _kernel(stream_s, waves * chain, 0.0, programs, resident, widen_s=widen_s)


def down_thread_values(rows: int, block_h: int, block_fd: int, warps: int) -> tuple[float, float]:
    """(values of the [rows, block_h] accumulator, values of the [block_fd, block_h] weight tile) a thread
    of kernel 2 holds: what its registers are counted from (DOWN_*_REGISTERS, fitted on these)."""
    threads = 32 * warps
    return rows * block_h / threads, block_fd * block_h / threads


def _swiglu_issue_s(config: DecodeConfig, rows: int, facts: hardware.ArchFacts) -> float:
    """Seconds one program of kernel 2 spends issuing a step's SwiGLU of up_split's partials (0 with one
    split: kernel 1 stored the hidden rows ready): every warp's instructions, an SM's schedulers each
    issuing one a clock."""
    if config.up_split == 1:
        return 0.0
    per_lane = rows * config.block_fd / LANES_PER_SCHEDULER
    per_warp = per_lane * (SWIGLU_INSTRUCTIONS + PARTIAL_INSTRUCTIONS_PER_SPLIT * config.up_split)
    return config.warps_down * per_warp / SCHEDULERS_PER_SM / facts.sustained_clock_hz


def _widen_s(
    problem: Problem,
    values: float,
    mode: str,
    rows: int,
    columns: int,
    programs: int,
    device: DeviceFingerprint,
) -> float:
    """Seconds the SMs running `programs` take to read `values` FP8 weight values into the dots by `mode`,
    a step's weight tile `columns` wide beside an x tile of `rows` (0 for 16-bit weights, which a dot
    reads as they are)."""
    if _itemsize(problem.rhs_dtype) != 1:
        return 0.0
    conversions = CONVERSIONS_PER_VALUE[mode] + (rows / (2 * columns) if mode == "f16" else 0.0)
    clocks = conversions / CONVERSION_LANES_PER_CLOCK + INTEGER_OPS_PER_VALUE[mode] / INTEGER_LANES_PER_CLOCK
    clock = hardware.facts(device.compute_capability).sustained_clock_hz
    return values * clocks / (max(1, min(device.core_count, programs)) * clock)


def _line_rate(device: DeviceFingerprint, run_bytes: int) -> float:
    """The HBM read rate of tiles whose rows are `run_bytes` contiguous bytes (LINE_BYTES)."""
    peak = hardware.hbm_bytes_per_s(device.device_kind, device.compute_capability)
    return peak * min(1.0, run_bytes / LINE_BYTES)


def _kernel(
    stream_s: float,
    chain_s: float,
    route_s: float,
    programs: int,
    resident: int,
    exposed_s: float = 0.0,
    widen_s: float = 0.0,
) -> KernelEstimate:
    """The launch, the routing no stream hides, then the largest of the limits (the chains less that
    routing, which they hold)."""
    seconds = LAUNCH_S + exposed_s + max(stream_s, chain_s - exposed_s, route_s, widen_s)
    return KernelEstimate(seconds, stream_s, chain_s, route_s, programs, resident, exposed_s, widen_s)


def estimate(problem: Problem, config: DecodeConfig, device: DeviceFingerprint) -> Estimate:
    """Both kernels of the block for `config` (a DecodeConfig) on `device`."""
    up, down = up_estimate(problem, config, device), down_estimate(problem, config, device)
    return Estimate(up.seconds + down.seconds, up, down)
