"""Search space, constraints and heuristic default of the `flydsl` backend (kernels/backends/flydsl/).

The target arch comes from the device fingerprint (compute_capability "gfx942" / "gfx950"); for a
compile-only sweep on a machine without that GPU, moetune.kernels.backends.flydsl.target_device(arch)
makes the stand-in fingerprint. Hardware limits (LDS per workgroup, MFMA shapes) come from the per-arch
table in kernels/backends/flydsl/plan.py, the one place the kernel, the constraints and the static checks
read them.
Constraints here prune what the plan can tell before compiling; what only the compiler knows (registers,
spills) is pruned after compiling, from the code object (kernels/backends/flydsl/metadata.py).
"""

from __future__ import annotations

from moetune.kernels.backends.flydsl.backend import device_arch
from moetune.kernels.backends.flydsl.config import MFMA_SIZES, TILE_ORDERS, FlyDSLConfig
from moetune.kernels.backends.flydsl.plan import ARCHS, KernelPlan
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.problem import Problem
from moetune.kernels.space import SearchSpace

DOMAINS = {
    "tile_m": (16, 32, 64, 128, 256),
    "tile_n": (64, 128, 256),
    "tile_k": (32, 64, 128),
    "waves_m": (1, 2, 4),
    "waves_n": (1, 2, 4),
    "k_waves": (1, 2, 4),
    "lds_stages": (1, 2),
    "waves_per_eu": (0, 1, 2),
    "xcd_swizzle": (0, 8),  # 8: the XCD count of MI300X/MI325X/MI355X
    "tile_order": TILE_ORDERS,
    "mfma": MFMA_SIZES,
    "lds_swizzle": (True, False),
}


def plan_of(problem: Problem, config: FlyDSLConfig, device: DeviceFingerprint) -> KernelPlan:
    return KernelPlan.of(device_arch(device) or "", problem.to_dict(), config.to_dict())


def target_is_amd(problem: Problem, config: FlyDSLConfig, device: DeviceFingerprint) -> str | None:
    arch = device_arch(device)
    if arch not in ARCHS:
        return (
            f"flydsl targets {', '.join(ARCHS)}; device {device.device_kind!r} is {arch or device.platform}"
        )
    return None


def kernel_can_be_built(problem: Problem, config: FlyDSLConfig, device: DeviceFingerprint) -> str | None:
    if problem.lhs_dtype != problem.rhs_dtype:
        return f"operand dtypes differ: {problem.lhs_dtype} x {problem.rhs_dtype}"
    reasons = plan_of(problem, config, device).violations()
    return "; ".join(reasons) if reasons else None


def tile_m_within_rows(problem: Problem, config: FlyDSLConfig, device: DeviceFingerprint) -> str | None:
    # A row tile taller than all M rows (rounded up to a power of two) only multiplies padding.
    largest_useful = max(DOMAINS["tile_m"][0], 1 << max(0, problem.m - 1).bit_length())
    if config.tile_m > largest_useful:
        return f"tile_m={config.tile_m} > {largest_useful}: M={problem.m} rows already fit in one tile"
    return None


def xcd_swizzle_needs_enough_tiles(
    problem: Problem, config: FlyDSLConfig, device: DeviceFingerprint
) -> str | None:
    # Renumbering fewer workgroups than XCDs changes nothing but the code.
    if not config.xcd_swizzle:
        return None
    workgroups = plan_of(problem, config, device).grid[0]
    if workgroups < 2 * config.xcd_swizzle:
        return f"xcd_swizzle={config.xcd_swizzle} with only {workgroups} workgroups"
    return None


# The first two say whether the kernel can be built at all; the others only prune.
VALIDITY_CONSTRAINTS = (target_is_amd, kernel_can_be_built)
CONSTRAINTS = (*VALIDITY_CONSTRAINTS, tile_m_within_rows, xcd_swizzle_needs_enough_tiles)


def space(problem: Problem, device: DeviceFingerprint) -> SearchSpace:
    return SearchSpace(
        config_cls=FlyDSLConfig, domains=DOMAINS, constraints=CONSTRAINTS, validity=VALIDITY_CONSTRAINTS
    )


# Preferred defaults, most specific first: (max average rows per expert, config). The first one the
# problem and arch accept wins; the averages are empirical guesses (not tuned on AMD hardware yet).
_HEURISTICS: tuple[tuple[float, FlyDSLConfig], ...] = (
    (32, FlyDSLConfig(tile_m=32, tile_n=128, tile_k=64, waves_m=1, waves_n=4, k_waves=1, lds_stages=2)),
    (128, FlyDSLConfig(tile_m=64, tile_n=128, tile_k=64, waves_m=2, waves_n=2, lds_stages=2)),
    (
        float("inf"),
        FlyDSLConfig(tile_m=128, tile_n=128, tile_k=64, waves_m=2, waves_n=2, lds_stages=2, xcd_swizzle=8),
    ),
    (float("inf"), FlyDSLConfig(tile_m=64, tile_n=64, tile_k=32, waves_m=2, waves_n=2, lds_stages=1)),
    (float("inf"), FlyDSLConfig(tile_m=16, tile_n=64, tile_k=32, waves_m=1, waves_n=1, lds_stages=1)),
)


def heuristic(problem: Problem, device: DeviceFingerprint) -> FlyDSLConfig:
    """A config that builds for `problem` on `device`'s arch (gfx942 when the device is not AMD)."""
    arch_device = device if device_arch(device) in ARCHS else _default_target()
    rows_per_expert = problem.m / problem.g
    fallback = None
    for limit, config in _HEURISTICS:
        if kernel_can_be_built(problem, config, arch_device) is not None:
            continue
        if rows_per_expert <= limit:
            return config
        fallback = fallback or config
    if fallback is None:
        from moetune.kernels.errors import Unsupported

        raise Unsupported(
            f"no FlyDSL config builds for {problem.key} (N and K must be multiples of 64 and 32)"
        )
    return fallback


def _default_target() -> DeviceFingerprint:
    from moetune.kernels.backends.flydsl.backend import target_device

    return target_device("gfx942")
