"""Search space of the mosaic_gpu backend's fused MoE decode block (ops "moe_decode_block" and, on FP8
weights, "moe_decode_block_fp8", kernel_decode.py): domains, named constraints, the baseline every sweep
times and the heuristic default.

The tunables are the block's DecodeConfig (kernels/moe/decode_block.py), one domain each, grouped by the
kernel that reads them: kernel 1's F tile per program (block_f), K step (block_k), pipeline depth, warps,
K split across programs (up_split: how many CTAs share one expert's F tile), its programs (up_programs:
0 for one per item, else that many streaming shares of the item list, each routing once), how it takes
the top k (route_by_rank: argmax rounds or ranks) and on how many rows (route_warp_rows: the batch's, or
one per warp); kernel 2's H tile per program (block_h), F step (block_fd), pipeline depth, warps and the
programs per H tile (down_split, whose float32 partial sums meet in a fixed order: deterministic); and
each kernel's widening of FP8 weights (widen_up, widen_down: kernels/moe/fp8_widen.py's conversion or
integer sequence) and which operand of its dots the FP8 weight tile is (swap_ab_up, swap_ab_down). A
field added to DecodeConfig is one line in its kernel's domains (a test holds the domains to
DecodeConfig's fields); the config class follows by itself (kernel_decode.DecodeBlockConfig).
`fused` adds the path the block replaces, the unfused MoE layer: the space's BASELINE, timed first in
every sweep, its other fields at their defaults.

Validity constraints: the widening's fit to the weights' and x's dtypes, the block's own entry check
(decode_block.unfit_reason, the very function the kernel calls), K tiles within one block of
block-scaled FP8 weights (the kernel's scale check), and the baseline's defaults. Pruning constraints
drop points that run but waste: a tile wider than its dim needs (H and F need not be multiples of the
tiles: a last tile past the end is masked), a pipeline deeper than a program's loop, a split with less
than one F step per program, shared memory past an SM's for the pipeline's stages, shares with no more
programs than items, routing rows padded where the batch already has a row per warp, swapped dot
operands on 16-bit weights. Every non-deterministic
variant (float atomics meeting partial sums) would be a field of its own named in the key (a Problem
field); none exists.

The heuristic ranks each kernel's configs with cost_model_decode.py apart (its estimate is a sum of the
two kernels', each reading its own fields and kernel 2 also up_split, whose partials it adds: it is
ranked once per up_split), best first, and takes the best pair that the whole space admits. Within TIE
of the best, the model cannot tell configs apart: it takes the one whose other limits lie furthest from
the bound (the most slack), then the fewer programs. It holds the fields the model has no term for
(MODEL_BLIND) at their defaults: sweeps time them.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Mapping
from typing import Any

from moetune.kernels.backends.mosaic_gpu import cost_model_decode as cost
from moetune.kernels.backends.mosaic_gpu import hardware
from moetune.kernels.backends.mosaic_gpu.kernel_decode import TILING, DecodeBlockConfig
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import ConfigInvalid, Unsupported
from moetune.kernels.moe import decode_block, fp8_widen
from moetune.kernels.moe.pallas_mode import pow2_at_least
from moetune.kernels.ops import fp8_scales
from moetune.kernels.ops.moe_decode_block import touched_experts
from moetune.kernels.problem import Problem
from moetune.kernels.space import Constraint, SearchSpace

# Kernel 1 (gate_up, SwiGLU) and kernel 2 (down, combine): each kernel's fields, one domain each.
UP_DOMAINS: dict[str, tuple] = {
    "block_f": (16, 32, 64, 128),
    "block_k": (32, 64, 128, 256),
    # Weight tiles in flight per program: deeper pipelines keep a few programs' narrow tiles at the
    # bytes in flight the HBM rate needs (Little's law) where items are few (one token).
    "stages_up": (2, 3, 4, 6, 8),
    "warps_up": (4, 8, 16),
    "up_split": (1, 2, 4),
    # 0: a program per (expert, F tile, split); else that many, each streaming a share of the list:
    # one, two or four per SM of a 132-SM Hopper part, and a power of two for shares that divide evenly.
    "up_programs": (0, 128, 132, 264, 528),
    "route_by_rank": (False, True),
    "route_warp_rows": (False, True),
    "widen_up": fp8_widen.MODES,
    "swap_ab_up": (False, True),
}
DOWN_DOMAINS: dict[str, tuple] = {
    "block_h": (32, 64, 128, 256),
    "block_fd": (32, 64, 128, 256),
    "stages_down": (2, 3, 4, 6, 8),
    "warps_down": (4, 8),
    "down_split": (1, 2, 4, 8, 16),
    "widen_down": fp8_widen.MODES,
    "swap_ab_down": (False, True),
}
# Each kernel's name, as its pallas_call in kernels/moe/decode_block.py gives it and CUPTI reports it, and
# the fields it reads: the block's time is the two kernels' in turn (SearchSpace.kernels).
KERNELS: dict[str, tuple[str, ...]] = {
    "moetune_decode_up": tuple(UP_DOMAINS),
    "moetune_decode_down": tuple(DOWN_DOMAINS),
}
# fused=False, the baseline, is timed apart (SearchSpace.baseline), not searched: it has no tiling to vary.
DOMAINS: dict[str, tuple] = {"fused": (True,), **UP_DOMAINS, **DOWN_DOMAINS}
# The path the block replaces: moe_mlp's unfused layer (kernel_decode.moe_decode_block).
BASELINE = DecodeBlockConfig(fused=False)
_DEFAULTS = DecodeBlockConfig()
# Every field at its domain's first value (the smallest; convert for the widening): what runs on any
# weights (check_problem).
SMALLEST = DecodeBlockConfig(**{name: values[0] for name, values in {**UP_DOMAINS, **DOWN_DOMAINS}.items()})
TIE = 0.01
# Fields the cost model has no term for: the heuristic holds them at their first value and sweeps time
# the rest. swap_ab_*: how a step's dot takes its operands changes its instructions (compiled for sm_90a,
# the FP8 block's kernel 1 at 32 tokens: 900-1888 a step with, 1229-2224 without; at one token some
# steps more), not its bytes or chain.
MODEL_BLIND = ("swap_ab_up", "swap_ab_down")
# Each kernel's best configs the heuristic pairs up; the best pairs are a sweep's seeds.
SEEDS = 4


def _sizes(problem: Problem) -> tuple[int, int, int, int, int]:
    """(tokens, experts, top_k, hidden, intermediate) as decode_block.unfit_reason takes them."""
    return problem.m, problem.g, problem.top_k, problem.k, problem.n // 2


def block_fits(problem: Problem, config: DecodeBlockConfig, device: DeviceFingerprint) -> str | None:
    """The kernel's own entry check (decode_block.unfit_reason): the batch's bounds and the tiles' fit."""
    if not config.fused:
        return None
    return decode_block.unfit_reason(*_sizes(problem), config.decode_config())


def widening_fits(problem: Problem, config: DecodeBlockConfig, device: DeviceFingerprint) -> str | None:
    """Each kernel's FP8 widening reads the problem's weights with its x (decode_block.widening_unfit_reason,
    the very check the kernel makes): `bits` only float8_e4m3fn with bfloat16; 16-bit weights keep
    `convert`, which they never run."""
    if not config.fused:
        return None
    rhs = problem.rhs_dtype
    return decode_block.widening_unfit_reason(config.decode_config(), rhs, rhs, problem.lhs_dtype)


def k_tiles_within_scale_blocks(
    problem: Problem, config: DecodeBlockConfig, device: DeviceFingerprint
) -> str | None:
    """FP8 weights with block scales (moe_decode_block_fp8): each K tile (kernel 1's block_k, kernel 2's
    block_fd) lies within one block of 128 rows, so one scale covers it, as decode_block's entry check
    asks. Example: block_k=256 over scale blocks of 128 rows would need two scales per tile."""
    if not config.fused or problem.scale_layout != "block_1x128_128x128":
        return None
    for name in ("block_k", "block_fd"):
        tile = getattr(config, name)
        if fp8_scales.BLOCK % tile:
            return f"{name}={tile} straddles the weights' scale blocks of {fp8_scales.BLOCK} rows"
    return None


def baseline_at_defaults(
    problem: Problem, config: DecodeBlockConfig, device: DeviceFingerprint
) -> str | None:
    if config.fused:
        return None
    changed = [
        f"{f.name}={getattr(config, f.name)}"
        for f in TILING
        if getattr(config, f.name) != getattr(_DEFAULTS, f.name)
    ]
    if changed:
        tiling = ", ".join(changed)
        return f"fused=False runs the unfused layer, which reads no tiling: leave {tiling} at its defaults"
    return None


def pipeline_depth_useful(
    problem: Problem, config: DecodeBlockConfig, device: DeviceFingerprint
) -> str | None:
    """No more stages than a program's loop has steps (kernel 1: its K steps; kernel 2: its F steps of an
    expert, the least of a program's share)."""
    if not config.fused:
        return None
    up_steps = decode_block.split_steps(problem.k, config.block_k, config.up_split)
    if config.stages_up > max(2, up_steps):
        return f"stages_up={config.stages_up} exceeds the {up_steps} K steps of a program"
    down_steps = decode_block.tiles(problem.n // 2, config.block_fd)
    if config.stages_down > max(2, down_steps):
        return f"stages_down={config.stages_down} exceeds the {down_steps} F steps of an expert"
    return None


def tiles_within_dims(problem: Problem, config: DecodeBlockConfig, device: DeviceFingerprint) -> str | None:
    """No tile wider than the dim it tiles rounded up to a power of two: past that a narrower tile covers
    the same dim in as many tiles, with fewer lanes masked past its end. Example: H=80 takes block_h up to
    128."""
    if not config.fused:
        return None
    dims = {"H": problem.k, "F": problem.n // 2}
    for name, dim in (("block_f", "F"), ("block_k", "H"), ("block_h", "H"), ("block_fd", "F")):
        tile = getattr(config, name)
        if tile > pow2_at_least(dims[dim]):
            return f"{name}={tile} is wider than {dim}={dims[dim]} needs"
    return None


def split_useful(problem: Problem, config: DecodeBlockConfig, device: DeviceFingerprint) -> str | None:
    """down_split programs of one H tile share the (touched expert, F step) list: each should hold at least
    one item of it under uniform routing."""
    if not config.fused or config.down_split == 1:
        return None
    items = touched_experts(problem) * decode_block.tiles(problem.n // 2, config.block_fd)
    if config.down_split > items:
        return f"down_split={config.down_split} exceeds the ~{items:.0f} (expert, F step) items of an H tile"
    return None


def shares_useful(problem: Problem, config: DecodeBlockConfig, device: DeviceFingerprint) -> str | None:
    """up_programs below kernel 1's (expert, F tile, split) units under uniform routing: with as many
    programs as units, each streams one, as the grid of one program per unit does without the shares'
    loop."""
    if not config.fused or not config.up_programs:
        return None
    units = touched_experts(problem) * decode_block.tiles(problem.n // 2, config.block_f) * config.up_split
    if config.up_programs >= units:
        return f"up_programs={config.up_programs} is not below the ~{units:.0f} (expert, F tile, split) units"
    return None


def warp_rows_useful(problem: Problem, config: DecodeBlockConfig, device: DeviceFingerprint) -> str | None:
    """route_warp_rows only where the batch has fewer rows than kernel 1 has warps: elsewhere it routes
    on the same rows as without it (decode_block.routing_rows)."""
    if not config.fused or not config.route_warp_rows:
        return None
    rows = pow2_at_least(problem.m)
    if decode_block.routing_rows(problem.m, config) == rows:
        return f"route_warp_rows changes nothing: the batch's {rows} rows cover warps_up={config.warps_up}"
    return None


def swap_ab_useful(problem: Problem, config: DecodeBlockConfig, device: DeviceFingerprint) -> str | None:
    """swap_ab_* with FP8 weights only: a 16-bit tile enters the dot from shared memory in the operand
    layout (ldmatrix) whichever operand it is; a widened FP8 tile is built in registers, which the swap
    lets the tensor cores read as they are."""
    if not config.fused or problem.rhs_dtype.startswith("float8"):
        return None
    swapped = [name for name in MODEL_BLIND if getattr(config, name)]
    if swapped:
        return f"{swapped[0]} only with FP8 weights"
    return None


def smem_fits(problem: Problem, config: DecodeBlockConfig, device: DeviceFingerprint) -> str | None:
    """Each kernel's pipelined loads and accumulators (cost_model_decode.pipeline_smem) within one
    program's shared memory: a config past it fails its compile."""
    if not config.fused:
        return None
    try:
        limit = hardware.facts(device.compute_capability).smem_per_block
    except Unsupported as e:
        return str(e)
    up, down = cost.pipeline_smem(problem, config.decode_config())
    if max(up, down) > limit:
        return f"needs {max(up, down)} bytes of shared memory per program > {limit}"
    return None


VALIDITY_CONSTRAINTS: tuple[Constraint, ...] = (
    widening_fits,
    block_fits,
    k_tiles_within_scale_blocks,
    baseline_at_defaults,
)
PRUNING_CONSTRAINTS: tuple[Constraint, ...] = (
    tiles_within_dims,
    pipeline_depth_useful,
    split_useful,
    shares_useful,
    warp_rows_useful,
    swap_ab_useful,
    smem_fits,
)
CONSTRAINTS: tuple[Constraint, ...] = VALIDITY_CONSTRAINTS + PRUNING_CONSTRAINTS
# The ranking asks only whether a point passes them all: the cheap pruning checks that drop the most
# points first (tiles, pipeline depth), so a dropped point costs one or two calls, not eleven.
_PRUNE_MOST = (tiles_within_dims, pipeline_depth_useful)
_CHEAP_FIRST = _PRUNE_MOST + tuple(c for c in CONSTRAINTS if c not in _PRUNE_MOST)
RESOURCE_CONSTRAINTS: frozenset[Constraint] = frozenset()


def check_problem(problem: Problem) -> None:
    """Unsupported where no tiling runs the block: the batch's bounds (T, T * top_k, E) or dims that are not
    multiples of 16 (decode_block.DIM_MULTIPLE)."""
    reason = decode_block.unfit_reason(*_sizes(problem), SMALLEST.decode_config())
    if reason is not None:
        raise Unsupported(reason)


def space(problem: Problem, device: DeviceFingerprint) -> SearchSpace:
    return SearchSpace(
        DecodeBlockConfig,
        dict(DOMAINS),
        CONSTRAINTS,
        seeding=functools.partial(preferred, problem, device),
        validity=VALIDITY_CONSTRAINTS,
        baseline=BASELINE,
        kernels=KERNELS,
    )


def _ranked(
    problem: Problem,
    device: DeviceFingerprint,
    domains: Mapping[str, tuple],
    kernel: Any,
    base: DecodeBlockConfig = SMALLEST,
) -> list[tuple[dict[str, Any], cost.KernelEstimate]]:
    """Every point of one kernel's `domains` with its estimate, best first (TIE: the module docstring). The
    other kernel's fields are `base`'s: by default their smallest values, which every shape the space
    serves takes."""
    names = list(domains)
    fixed = base.to_dict()  # once: dataclasses.replace would list base's fields at every point
    rows = []
    for values in itertools.product(*(domains[name] for name in names)):
        params = dict(zip(names, values, strict=True))
        try:
            config = DecodeBlockConfig(**(fixed | params))
        except ConfigInvalid:  # a rule of the tiling's own
            continue
        if any(c(problem, config, device) for c in _CHEAP_FIRST):
            continue
        rows.append((params, kernel(problem, config.decode_config(), device)))
    if not rows:
        return []
    best = min(e.seconds for _, e in rows)
    bucket = lambda e: math.floor(math.log(e.seconds / best) / math.log1p(TIE))  # noqa: E731
    rows.sort(key=lambda r: (bucket(r[1]), r[1].terms[1:], r[1].programs, r[1].seconds))
    return rows


def _ranked_domains(problem: Problem, domains: Mapping[str, tuple]) -> dict[str, tuple]:
    """`domains` as the ranking enumerates them: without the widenings the problem's dtypes rule out
    (widening_fits), which it would otherwise enumerate with every other field only to drop, and the
    MODEL_BLIND fields at their first value (the model would rank their values alike)."""
    fits = lambda mode: fp8_widen.unfit_reason(mode, problem.rhs_dtype, problem.lhs_dtype) is None  # noqa: E731
    narrowed = {
        name: tuple(filter(fits, values)) if name in decode_block.WIDEN_FIELDS else values
        for name, values in domains.items()
    }
    return {name: values[:1] if name in MODEL_BLIND else values for name, values in narrowed.items()}


@functools.lru_cache(maxsize=256)
def ranking(
    problem: Problem, device: DeviceFingerprint
) -> tuple[tuple[DecodeBlockConfig, cost.Estimate], ...]:
    """The fused configs the heuristic considers, best first: for each up_split (the one field both
    kernels read: kernel 2 adds its partials), kernel 1's best few configs with it (SEEDS) and kernel 2's
    best few given it, those pairs the whole space admits, in the order of the pair's estimate (within
    TIE, of the kernels' ranks). Empty where the device has no hardware facts."""
    try:
        hardware.facts(device.compute_capability)
    except Unsupported:
        return ()
    ups = _ranked(problem, device, _ranked_domains(problem, UP_DOMAINS), cost.up_estimate)
    downs = _ranked_domains(problem, DOWN_DOMAINS)
    pairs = []
    for split in UP_DOMAINS["up_split"]:
        base = dataclasses.replace(SMALLEST, up_split=split)
        down = _ranked(problem, device, downs, cost.down_estimate, base)[:SEEDS]
        paired = 0
        # Kernel 1's configs with this split in their order, the first SEEDS that pair with one of
        # kernel 2's best: a pair may fail where each alone fits (shared memory of both, say).
        for rank, (up_params, _) in enumerate(ups):
            if up_params["up_split"] != split:
                continue
            found = False
            for j, (down_params, _) in enumerate(down):
                config = DecodeBlockConfig(**up_params, **down_params)
                if not any(c(problem, config, device) for c in CONSTRAINTS):
                    pairs.append((rank + j, config, cost.estimate(problem, config.decode_config(), device)))
                    found = True
            paired += found
            if paired == SEEDS:
                break
    # By the pair's own estimate; within TIE, as each kernel's configs are ranked: the most slack (the
    # kernels' runner-up limits, summed), then the kernels' ranks.
    best = min((p[2].seconds for p in pairs), default=0.0)
    bucket = lambda e: math.floor(math.log(e.seconds / best) / math.log1p(TIE))  # noqa: E731
    slack = lambda e: e.up.terms[1] + e.down.terms[1]  # noqa: E731
    pairs.sort(key=lambda p: (bucket(p[2]), slack(p[2]), p[0], p[2].seconds))
    return tuple((config, estimate) for _, config, estimate in pairs)


def preferred(problem: Problem, device: DeviceFingerprint) -> list[DecodeBlockConfig]:
    """A sweep's seeds: the heuristic's best pairs of each kernel's best configs."""
    return [config for config, _ in ranking(problem, device)[:SEEDS]]


def portable(problem: Problem) -> DecodeBlockConfig:
    """The smallest tiles (the first fused config in domain order), which every shape the block serves
    takes (check_problem): what a device without hardware facts gets (Pallas's interpreter on a CPU)."""
    check_problem(problem)
    return SMALLEST


def heuristic(problem: Problem, device: DeviceFingerprint) -> DecodeBlockConfig:
    """The cost model's best fused config (`ranking`), or `portable` where the device has no facts."""
    ranked = ranking(problem, device)
    return ranked[0][0] if ranked else portable(problem)
