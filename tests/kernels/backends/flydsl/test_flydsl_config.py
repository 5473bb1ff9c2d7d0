"""FlyDSLConfig's own rules and JSON round-trip, and the launch plan's arithmetic and rules."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moetune.kernels.backends.flydsl.config import FlyDSLConfig
from moetune.kernels.backends.flydsl.plan import ARCHS, KernelPlan, occupancy_waves_per_simd
from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.problem import Problem

GATE_UP = Problem("grouped_matmul", 4096, 4096, 28672, 8)
DOWN = Problem("grouped_matmul", 4096, 14336, 4096, 8)


def plan(problem=GATE_UP, arch="gfx942", **config) -> KernelPlan:
    return KernelPlan.of(arch, problem.to_dict(), FlyDSLConfig(**config).to_dict())


def test_json_round_trip():
    config = FlyDSLConfig(tile_m=64, k_waves=2, tile_order="n_major", lds_swizzle=False, xcd_swizzle=8)
    assert FlyDSLConfig.from_json(config.to_json()) == config
    assert hash(config) == hash(FlyDSLConfig.from_json(config.to_json()))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tile_m": 48}, "tile_m=48 must be a positive power of two"),
        ({"tile_n": 512}, "must lie in \\[16, 256\\]"),
        ({"waves_m": 4, "waves_n": 4, "k_waves": 2}, "32 > 16 waves"),
        ({"lds_stages": 3}, "lds_stages=3 must be 1 or 2"),
        ({"xcd_swizzle": 1}, "xcd_swizzle=1"),
        ({"tile_order": "diagonal"}, "tile_order='diagonal'"),
        ({"mfma": 8}, "mfma=8"),
        ({"waves_per_eu": 9}, "waves_per_eu=9"),
    ],
)
def test_config_rules(fields, message):
    with pytest.raises(ConfigInvalid, match=message):
        FlyDSLConfig(**fields)


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("problem", [GATE_UP, DOWN], ids=["gate_up", "down"])
def test_the_default_config_plans_for_mixtral_on_both_archs(arch, problem):
    p = plan(problem, arch)
    assert p.violations() == []
    assert p.grid == ((4096 // 128 + 8) * (problem.n // 128), 1, 1)
    assert p.block == (256, 1, 1)


def test_mfma_shape_depends_on_arch_and_dtype():
    assert plan(arch="gfx942").mfma_shape == (16, 16, 16)
    assert plan(arch="gfx950").mfma_shape == (16, 16, 32)  # CDNA4 doubled K for 16-bit operands
    assert plan(arch="gfx942", mfma=32).mfma_shape == (32, 32, 8)


@pytest.mark.parametrize(
    ("arch", "config", "message"),
    [
        ("gfx942", {"tile_m": 256, "tile_n": 256}, "LDS 131072 bytes > 65536 on gfx942"),
        ("gfx950", {"tile_k": 16}, "tile_k=16 is not a multiple of k_waves\\*32=32 \\(MFMA K=32\\)"),
        ("gfx950", {"tile_k": 32, "k_waves": 2}, "tile_k=32 is not a multiple of k_waves\\*32"),
        ("gfx942", {"tile_m": 16, "waves_m": 2}, "tile_m=16 is not a multiple of waves_m\\*16=32"),
        (
            "gfx942",
            {"tile_m": 16, "waves_m": 1, "tile_k": 32},
            "A copy: 16 lines are not a multiple of 32 per pass",
        ),
        ("gfx90a", {}, "arch='gfx90a'"),
    ],
)
def test_plan_rules_name_the_values(arch, config, message):
    violations = plan(arch=arch, **config).violations()
    assert any(re.search(message, v) for v in violations), violations


def test_n_must_be_a_multiple_of_tile_n():
    odd = dataclasses.replace(GATE_UP, n=1000)
    assert "N=1000 is not a multiple of tile_n=128" in plan(odd).violations()


def test_operands_past_4_gib_are_refused():
    huge = dataclasses.replace(DOWN, m=1 << 18)  # 2^18 rows x 14336 x 2 bytes = 7.5 GB of lhs
    assert any("buffer descriptor limit" in v for v in plan(huge).violations())


def test_lds_holds_the_stages_or_the_k_wave_partials_whichever_is_larger():
    assert plan(lds_stages=1).lds_bytes == (128 + 128) * 64 * 2
    assert plan(lds_stages=2).lds_bytes == 2 * (128 + 128) * 64 * 2
    assert plan(tile_m=64, tile_n=64, k_waves=4, lds_stages=1).lds_bytes == 3 * 64 * 64 * 4


@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=16),
    tail=st.integers(0, 200),
    tile_m=st.sampled_from([16, 32, 64, 128, 256]),
)
def test_m_slots_bound_every_routing(sizes, tail, tile_m):
    # The kernel maps each group's rows (and the tail past sum(sizes)) to ceil(rows / tile_m) tiles.
    m = sum(sizes) + tail
    problem = Problem("grouped_matmul", max(m, 1), 64, 64, len(sizes))
    p = KernelPlan.of("gfx942", problem.to_dict(), FlyDSLConfig(tile_m=tile_m).to_dict())
    used = sum(-(-s // tile_m) for s in sizes) + -(-tail // tile_m)
    assert used <= p.m_slots


def test_occupancy_is_limited_by_registers_and_lds():
    assert occupancy_waves_per_simd("gfx942", 128, 0, 256, 0) == 4
    assert occupancy_waves_per_simd("gfx942", 256, 0, 256, 0) == 2
    assert occupancy_waves_per_simd("gfx942", 64, 0, 256, ARCHS["gfx942"]["lds_bytes"]) == 1
    assert occupancy_waves_per_simd("gfx950", 64, 0, 256, ARCHS["gfx942"]["lds_bytes"]) == 2
