"""The flydsl search space: its constraints (pure, CPU) and its heuristic default."""

from __future__ import annotations

import pytest

from moetune.kernels.backends.flydsl import FlyDSLConfig, target_device
from moetune.kernels.backends.flydsl import space as space_mod
from moetune.kernels.backends.flydsl.plan import KernelPlan
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.problem import Problem
from moetune.kernels.space import SearchSpace

GATE_UP = Problem("grouped_matmul", 4096, 4096, 28672, 8)
DOWN = Problem("grouped_matmul", 4096, 14336, 4096, 8)
DECODE = Problem("grouped_matmul", 64, 4096, 28672, 8)
CPU = DeviceFingerprint("cpu", "cpu", 2, 0, "x86_64", "", "", "", "")


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("problem", [GATE_UP, DOWN, DECODE], ids=["gate_up", "down", "decode"])
def test_heuristic_builds_and_passes_every_constraint(arch, problem):
    device = target_device(arch)
    config = space_mod.heuristic(problem, device)
    assert space_mod.space(problem, device).violation(problem, config, device) is None


def test_heuristic_picks_smaller_row_tiles_for_few_tokens_per_expert():
    assert (
        space_mod.heuristic(DECODE, target_device("gfx942")).tile_m
        < space_mod.heuristic(GATE_UP, target_device("gfx942")).tile_m
    )


def test_no_point_is_valid_off_amd():
    sp = space_mod.space(GATE_UP, CPU)
    assert "flydsl targets gfx942, gfx950" in sp.violation(GATE_UP, FlyDSLConfig(), CPU)


@pytest.mark.parametrize(
    ("problem", "config", "reason"),
    [
        (GATE_UP, FlyDSLConfig(tile_m=256, tile_n=256), "LDS 131072 bytes > 65536"),
        (DECODE, FlyDSLConfig(tile_m=128, waves_m=2), "tile_m=128 > 64: M=64 rows already fit"),
        (
            Problem("grouped_matmul", 16, 64, 64, 1),
            FlyDSLConfig(tile_m=16, waves_m=1, tile_n=64, xcd_swizzle=8, tile_k=32, waves_n=1),
            "xcd_swizzle=8 with only 2 workgroups",
        ),
    ],
)
def test_constraints_prune_with_the_reason(problem, config, reason):
    device = target_device("gfx942")
    assert reason in space_mod.space(problem, device).violation(problem, config, device)


def test_every_valid_point_plans_cleanly_on_gfx950():
    # A slice of the space (the full product is ~10^5 points): constraints and kernel plan agree.
    device = target_device("gfx950")
    domains = dict(
        space_mod.DOMAINS, waves_per_eu=(0,), tile_order=("m_major",), lds_swizzle=(True,), mfma=(16,)
    )
    sp = SearchSpace(FlyDSLConfig, domains, space_mod.CONSTRAINTS)
    valid, pruned = sp.enumerate(DOWN, device)
    assert valid and pruned
    assert all(not KernelPlan.of("gfx950", DOWN.to_dict(), c.to_dict()).violations() for c in valid)
    assert all(p.reason for p in pruned)
