"""The mosaic_gpu search space: each named constraint, pruning counts and the heuristic default."""

from __future__ import annotations

import dataclasses
import time

import pytest

from moetune.kernels.backends.mosaic_gpu import hardware, tiling
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig as C
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import ConfigInvalid, Unsupported
from moetune.kernels.problem import Problem
from moetune.search_spaces import mosaic_gpu as space

HOPPER = DeviceFingerprint("NVIDIA H200", "gpu", 132, 0, "9.0", "", "", "", "")
AMPERE = dataclasses.replace(HOPPER, device_kind="NVIDIA A100", compute_capability="8.0")
GATE_UP = Problem("grouped_matmul", m=8192, k=4096, n=28672, g=8)
DECODE = Problem("grouped_matmul", m=32, k=4096, n=28672, g=8)
DEFAULT = C()  # 128x128 per consumer, split along N: a 128x256 CTA tile, 4 stages of 64


def _reason(constraint, problem, config, device=HOPPER):
    return constraint(problem, config, device)


def test_k_divisible():
    assert _reason(space.k_divisible, GATE_UP, DEFAULT) is None
    odd_k = dataclasses.replace(GATE_UP, k=4096 + 32)
    assert "K=4128 is not a multiple of block_k * split_k = 64" in _reason(space.k_divisible, odd_k, DEFAULT)
    split = C(block_m=64, block_k=128, split_k=4, wg_split="n")
    assert "= 512" in _reason(space.k_divisible, dataclasses.replace(GATE_UP, k=4096 + 128), split)


def test_n_divisible_uses_the_cta_tile():
    n_320 = dataclasses.replace(GATE_UP, n=320)
    assert "CTA tile's 256 columns" in _reason(space.n_divisible, n_320, DEFAULT)
    assert _reason(space.n_divisible, n_320, C(block_n=64, wg_split="none")) is None


def test_tma_box_fits():
    assert _reason(space.tma_box_fits, GATE_UP, C(block_m=64, block_n=256, wg_split="m")) is None
    assert "TMA box" in _reason(space.tma_box_fits, GATE_UP, C(block_m=64, block_n=256, wg_split="n"))


def test_epilogue_rows_aligned():
    assert _reason(space.epilogue_rows_aligned, GATE_UP, C(epi_tile_n=64)) is None
    assert "64-byte rows" in _reason(space.epilogue_rows_aligned, GATE_UP, C(epi_tile_n=32))
    # Split-K stores float32 partial sums, so 32 columns already fill 128 bytes.
    split = C(block_m=64, epi_tile_n=32, split_k=2)
    assert _reason(space.epilogue_rows_aligned, DECODE, split) is None


def test_accumulator_fits_registers():
    assert _reason(space.accumulator_fits_registers, GATE_UP, DEFAULT) is None
    big = C(block_m=128, block_n=256, wg_split="m")
    assert "registers/thread" in _reason(space.accumulator_fits_registers, GATE_UP, big)
    assert "no hardware facts" in _reason(space.accumulator_fits_registers, GATE_UP, DEFAULT, AMPERE)


def test_smem_fits_reads_the_limit_from_the_architecture_table(monkeypatch):
    assert _reason(space.smem_fits, GATE_UP, DEFAULT) is None
    five_stages = dataclasses.replace(DEFAULT, max_concurrent_steps=5)
    limit = hardware.ARCHS["9.0"].smem_per_block
    assert f"> {limit}" in _reason(space.smem_fits, GATE_UP, five_stages)
    smaller = dataclasses.replace(hardware.ARCHS["9.0"], smem_per_block=100 * 1024)
    monkeypatch.setitem(hardware.ARCHS, "9.0", smaller)
    assert f"> {100 * 1024}" in _reason(space.smem_fits, GATE_UP, DEFAULT)
    assert "no hardware facts" in _reason(space.smem_fits, GATE_UP, DEFAULT, AMPERE)


def test_smem_model_counts_stages_and_epilogue():
    # 4 stages of (128 + 256) x 64 bf16, plus 2 consumers x 2 slots of 64 x 64 bf16.
    expected = 4 * (128 + 256) * 64 * 2 + 2 * 2 * 64 * 64 * 2 + tiling.SMEM_OVERHEAD_BYTES
    assert tiling.smem_bytes(GATE_UP, DEFAULT) == expected
    # Fewer K steps than stages: only k_steps stages are allocated.
    short_k = dataclasses.replace(GATE_UP, k=128)
    assert tiling.geometry(short_k, DEFAULT).stages == 2


def test_pruning_constraints():
    assert _reason(space.pipeline_depth_useful, dataclasses.replace(GATE_UP, k=128), DEFAULT) is not None
    assert _reason(space.pipeline_depth_useful, GATE_UP, DEFAULT) is None
    split = C(block_m=64, split_k=2)
    assert "only pays for M <= 512" in _reason(space.split_k_only_small_m, GATE_UP, split)
    assert _reason(space.split_k_only_small_m, DECODE, split) is None
    padded = C(block_m=64, pad_lhs=True)
    assert "pads only M <= the 64-row CTA tile" in _reason(
        space.pad_lhs_only_small_m, DECODE.with_m(72), padded
    )
    assert _reason(space.pad_lhs_only_small_m, DECODE.with_m(64), padded) is None
    assert "mostly padding" in _reason(space.cta_rows_not_wasted, DECODE, DEFAULT)
    assert _reason(space.cta_rows_not_wasted, DECODE, C(block_m=64)) is None


def test_build_checks_only_validity():
    assert set(space.VALIDITY_CONSTRAINTS).isdisjoint(space.PRUNING_CONSTRAINTS)
    assert space.RESOURCE_CONSTRAINTS <= set(space.VALIDITY_CONSTRAINTS)
    assert space.CONSTRAINTS == space.VALIDITY_CONSTRAINTS + space.PRUNING_CONSTRAINTS


def test_pruning_counts_for_mixtral_gate_up():
    search = space.space(GATE_UP, HOPPER)
    assert search.domains["split_k"] == (1,)  # M > 512: split-K is not in the space
    valid, pruned = search.enumerate(GATE_UP, HOPPER)
    assert search.size == len(valid) + len(pruned)
    # Pinned: a change to the domains or constraints shows up here and in the tuner's budget. pad_lhs
    # doubles the grid and adds no valid config at this M (the pad only applies within one CTA tile); the
    # "expert" tile order multiplies both by 1.5.
    assert (search.size, len(valid)) == (155520, 10560)
    for config in valid:
        assert search.violation(GATE_UP, config, HOPPER) is None
        assert tiling.smem_bytes(GATE_UP, config) <= hardware.ARCHS["9.0"].smem_per_block
    assert all(p.reason for p in pruned)
    assert DEFAULT in valid


def test_decode_space_offers_split_k():
    search = space.space(DECODE, HOPPER)
    assert search.domains["split_k"] == (1, 2, 4)


@pytest.mark.parametrize(
    "problem, why",
    [
        (dataclasses.replace(GATE_UP, lhs_dtype="float32", rhs_dtype="float32"), "bfloat16 or float16"),
        (dataclasses.replace(GATE_UP, rhs_dtype="float16"), "of one dtype"),
        (dataclasses.replace(GATE_UP, k=4100), "K=4100"),
        (dataclasses.replace(GATE_UP, n=100), "N=100"),
        (dataclasses.replace(GATE_UP, op="grouped_matmul_geglu"), "op='grouped_matmul_geglu'"),
    ],
)
def test_unservable_problems_are_unsupported(problem, why):
    with pytest.raises(Unsupported, match=why):
        space.space(problem, HOPPER)


@pytest.mark.parametrize(
    "problem",
    [
        GATE_UP,
        DECODE,
        Problem("grouped_matmul", m=2, k=14336, n=4096, g=8),
        Problem("grouped_matmul", m=5000, k=7168, n=2048, g=256),
        Problem("grouped_matmul", m=100, k=96, n=64, g=4, out_dtype="float32"),
        Problem(
            "grouped_matmul",
            m=300,
            k=2048,
            n=1408,
            g=64,
            lhs_dtype="f16",
            rhs_dtype="f16",
            transpose_rhs=True,
        ),
    ],
)
def test_heuristic_is_valid_and_fast(problem):
    start = time.perf_counter()
    config = space.heuristic(problem, HOPPER)
    assert time.perf_counter() - start < 0.5  # dispatch calls it: it must not enumerate the space
    assert all(c(problem, config, HOPPER) is None for c in space.VALIDITY_CONSTRAINTS)


def test_heuristic_picks_by_rows_per_expert():
    assert space.heuristic(DECODE, HOPPER).block_m == 64
    assert space.heuristic(GATE_UP, HOPPER).cta_m == 128
    assert space.heuristic(GATE_UP, HOPPER).cta_n == 256


def test_one_token_of_decode_starts_from_the_h200_sweeps_t1_winners():
    """Mixtral at T=1 (m=2, a quarter row per expert): the 2026-11-30 H200 sweep's winners, one plain
    warpgroup per 256 weight columns, one CTA per tile, split-K 4 for the plain GEMM; gate_up+SwiGLU with its
    lhs padded (111.7 against 118.0 us, measured); at m=4 the memory-bound default."""
    down = Problem("grouped_matmul", m=2, k=14336, n=4096, g=8)
    swiglu = Problem("grouped_matmul_swiglu", m=2, k=4096, n=28672, g=8)
    plain = dict(block_m=64, block_k=64, persistent=False, warp_specialized=False, wg_split="none")
    winners = {  # the sweep's T=1 winners, as its pack recorded them (before pad_lhs existed)
        down: C(**plain, block_n=256, max_concurrent_steps=3, grid_tile_width=1, split_k=4),
        swiglu: C(**plain, block_n=128, max_concurrent_steps=4, grid_minor_dim="n", grid_tile_width=4),
    }
    for problem, pad in ((down, False), (swiglu, True)):
        config = space.heuristic(problem, HOPPER)
        assert config == dataclasses.replace(winners[problem], pad_lhs=pad)
        assert not config.persistent and not config.warp_specialized
        assert space.space(problem, HOPPER).seeds[0] == config
    assert space.heuristic(dataclasses.replace(down, m=4), HOPPER).warp_specialized


def test_the_space_seeds_every_admissible_preferred_config_heuristic_first():
    swiglu = dataclasses.replace(GATE_UP, op="grouped_matmul_swiglu")
    seeds = space.space(swiglu, HOPPER).seeds
    # Both SwiGLU compute-bound shapes (128x64 split along N, 64x128 split along M) in the expert order (1024
    # rows per expert), then in the "m" order, then the memory-bound one; above 1024 rows "m" comes first.
    shapes = [(c.block_m, c.block_n, c.wg_split, c.grid_minor_dim) for c in seeds]
    assert shapes == [
        (128, 64, "n", "expert"),
        (64, 128, "m", "expert"),
        (128, 64, "n", "m"),
        (64, 128, "m", "m"),
        (64, 64, "n", "m"),
    ]
    assert seeds[0] == space.heuristic(swiglu, HOPPER)
    longer = space.space(dataclasses.replace(swiglu, m=4 * swiglu.m), HOPPER).seeds
    assert [c.grid_minor_dim for c in longer] == ["m", "m", "expert", "expert", "m"]
    for problem in (GATE_UP, DECODE, swiglu):
        seeded = space.space(problem, HOPPER)
        assert seeded.seeds and all(seeded.violation(problem, c, HOPPER) is None for c in seeded.seeds)
    # Preferred configs the problem cannot run are left out: K=96 admits none (all have block_k 64 or 128),
    # and the heuristic falls back to the always-valid config.
    odd = Problem("grouped_matmul", m=8192, k=96, n=4096, g=8)
    assert space.space(odd, HOPPER).seeds == ()
    assert space.heuristic(odd, HOPPER).block_k == 32


def test_a_sweep_may_narrow_some_domains_to_subsets():
    full = space.space(GATE_UP, HOPPER)
    narrow = full.restricted({"block_n": [256, 128], "split_k": 1, "persistent": [False]})
    assert narrow.domains["block_n"] == (256, 128) and narrow.domains["split_k"] == (1,)
    assert narrow.domains["block_m"] == full.domains["block_m"]
    assert narrow.size * 3 == full.size  # block_n 3 -> 2 values, persistent 2 -> 1: x 2/3 x 1/2
    assert full.restricted(None) is full
    with pytest.raises(ConfigInvalid, match="'blok_n' is not a parameter"):
        full.restricted({"blok_n": [128]})
    with pytest.raises(ConfigInvalid, match="not a non-empty subset"):
        full.restricted({"block_n": [96]})
    with pytest.raises(ConfigInvalid, match="not a non-empty subset"):
        full.restricted({"block_n": []})


def test_heuristic_walks_experts_one_after_another_when_compute_bound():
    """The plain GEMM's compute-bound heuristic takes the expert tile order (measured faster under skewed
    routing); sweeps start from both orders of each preferred tile. SwiGLU takes it up to 1024 rows per
    expert and keeps the "m" order first above (as an H200 sweep of Mixtral's gate_up found)."""
    assert space.heuristic(GATE_UP, HOPPER).grid_minor_dim == "expert"
    orders = {(c.block_m, c.block_n, c.block_k): set() for c in space.preferred(GATE_UP, HOPPER)}
    for c in space.preferred(GATE_UP, HOPPER):
        orders[(c.block_m, c.block_n, c.block_k)].add(c.grid_minor_dim)
    assert all({"m", "expert"} <= found for found in orders.values() if found & {"expert"})
    swiglu = dataclasses.replace(GATE_UP, op="grouped_matmul_swiglu")
    assert swiglu.m / swiglu.g == space.SWIGLU_EXPERT_ORDER_MAX_ROWS
    assert space.heuristic(swiglu, HOPPER).grid_minor_dim == "expert"
    long_prefill = dataclasses.replace(swiglu, m=2 * swiglu.m)
    assert space.heuristic(long_prefill, HOPPER).grid_minor_dim == "m"
    assert set(space.preferred(swiglu, HOPPER)) == set(space.preferred(long_prefill, HOPPER))
    assert space.heuristic(DECODE, HOPPER).grid_minor_dim != "expert"
