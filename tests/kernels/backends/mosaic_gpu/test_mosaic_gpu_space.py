"""The mosaic_gpu search space: each named constraint, pruning counts and the heuristic default."""

from __future__ import annotations

import dataclasses
import time

import pytest

from moetune.kernels.backends.mosaic_gpu import cost_model as cost
from moetune.kernels.backends.mosaic_gpu import hardware, space, tiling
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig as C
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import ConfigInvalid, Unsupported
from moetune.kernels.problem import Problem

HOPPER = DeviceFingerprint("NVIDIA H200", "gpu", 132, 0, "9.0", "", "", "", "")
AMPERE = dataclasses.replace(HOPPER, device_kind="NVIDIA A100", compute_capability="8.0")
GATE_UP = Problem("grouped_matmul", m=8192, k=4096, n=28672, g=8)
DECODE = Problem("grouped_matmul", m=32, k=4096, n=28672, g=8)
DEFAULT = C()  # 128x128 per consumer, split along N: a 128x256 CTA tile, 4 stages of 64
MIXTRAL_DOWN = Problem("grouped_matmul", m=8192, k=14336, n=4096, g=8)
QWEN3_GATE_UP = Problem("grouped_matmul_swiglu", m=8192, k=2048, n=1536, g=128)
QWEN3_DOWN = Problem("grouped_matmul", m=8192, k=768, n=2048, g=128)
# The development models: (experts, top-k, hidden, expert FFN width).
DEV_MODELS = {
    "qwen3-30b-a3b": (128, 8, 2048, 768),
    "deepseek-v3": (256, 8, 7168, 2048),
    "deepseek-v3-ep8": (32, 8, 7168, 2048),
    "qwen3-next-80b-a3b": (512, 10, 2048, 512),
    "mixtral-8x7b": (8, 2, 4096, 14336),
}
TOKENS = (1, 16, 128, 1024, 4096, 16384)


def _model_problems(model: str) -> list[Problem]:
    g, k, hidden, ffn = DEV_MODELS[model]
    return [
        problem
        for t in TOKENS
        for problem in (
            Problem("grouped_matmul_swiglu", m=t * k, k=hidden, n=2 * ffn, g=g),
            Problem("grouped_matmul", m=t * k, k=ffn, n=hidden, g=g),
        )
    ]


def _reason(constraint, problem, config, device=HOPPER):
    return constraint(problem, config, device)


def _fp8(k, n, layout="block_1x128_128x128"):
    fp8 = "float8_e4m3fn"
    return Problem(
        "grouped_matmul_fp8", 4096, k, n, 8, fp8, fp8, "bfloat16", transpose_rhs=True, scale_layout=layout
    )


def test_k_steps_fit_takes_a_partial_last_step_split_evenly():
    assert _reason(space.k_steps_fit, GATE_UP, DEFAULT) is None
    # K=4128 in 64-wide steps: 64 whole steps and one of 32 columns.
    assert _reason(space.k_steps_fit, dataclasses.replace(GATE_UP, k=4096 + 32), DEFAULT) is None
    split = C(block_m=64, block_k=128, split_k=4, wg_split="n")
    # 33 steps (the last partial) do not split over 4 CTAs; 36 (K=4512: 35 whole and one of 32) do.
    reason = _reason(space.k_steps_fit, dataclasses.replace(GATE_UP, k=4096 + 128), split)
    assert "makes 33 steps of block_k=128, not a multiple of split_k=4" in reason
    assert _reason(space.k_steps_fit, dataclasses.replace(GATE_UP, k=4512), split) is None
    # FP8 with scales constant along K takes a partial step; block scales whole steps only.
    assert _reason(space.k_steps_fit, _fp8(2880, 4096, "row_channel"), C(block_k=256)) is None
    assert "(block scales)" in _reason(space.k_steps_fit, _fp8(4096 + 128, 4096), C(block_k=256))


def test_n_tiles_fit_takes_a_partial_last_tile_but_not_under_block_scales():
    n_320 = dataclasses.replace(GATE_UP, n=320)
    assert _reason(space.n_tiles_fit, n_320, DEFAULT) is None
    assert _reason(space.n_tiles_fit, _fp8(4096, 320, "row_channel"), DEFAULT) is None
    assert "CTA tile's 256 columns" in _reason(space.n_tiles_fit, _fp8(4096, 384), DEFAULT)
    assert _reason(space.n_tiles_fit, _fp8(4096, 384), C(block_n=128, wg_split="none")) is None


@pytest.mark.parametrize(
    "k, n", [(2880, 2880), (1440, 2880), (2880, 5760), (2048, 1408), (1408, 2816), (2880, 1440)]
)
def test_partial_widths_are_problems_and_full_width_tail_configs_pass_every_validity_constraint(k, n):
    problem = dataclasses.replace(GATE_UP, k=k, n=n)
    space.check_problem(problem)
    wide = C(block_m=128, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="n")
    assert all(c(problem, wide, HOPPER) is None for c in space.VALIDITY_CONSTRAINTS)
    with pytest.raises(Unsupported, match="K=2888 is not a multiple of 16"):
        space.check_problem(dataclasses.replace(problem, k=2888))


def test_n_need_only_be_a_multiple_of_32_and_the_swiglu_up_columns_of_f():
    # gpt-oss at TP=2: F = 1440 = 22.5 x 64, under swiglu rhs [G, 2880, 2880].
    space.check_problem(Problem("grouped_matmul_swiglu", m=4096, k=2880, n=2880, g=128))
    space.check_problem(_fp8(2880, 1440, "row_channel"))
    with pytest.raises(Unsupported, match="N=1424 is not a multiple of 32"):
        space.check_problem(dataclasses.replace(GATE_UP, k=2880, n=1424))
    with pytest.raises(Unsupported, match="F=712 is not a multiple of 32"):
        space.check_problem(Problem("grouped_matmul_swiglu", m=4096, k=2880, n=1424, g=128))


def test_epilogue_fits_the_swizzle_that_n_takes():
    # N = 1440 takes 64-byte (32-column) swizzled epilogue tiles: 64-column chunks store through them,
    # 128-column chunks and swap_ab's transposed stores do not lower (jax 0.11.2).
    n_1440 = dataclasses.replace(GATE_UP, k=2880, n=1440)
    assert _reason(space.epilogue_fits_swizzle, n_1440, C(epi_tile_n=64)) is None
    assert "64-byte swizzle" in _reason(space.epilogue_fits_swizzle, n_1440, C(epi_tile_n=128))
    swap = C(block_m=16, block_n=64, wg_split="none", warp_specialized=False)
    assert "swap_ab" in _reason(space.epilogue_fits_swizzle, n_1440, swap)
    assert _reason(space.epilogue_fits_swizzle, GATE_UP, swap) is None
    # float32 partial sums (split-K): 32 columns are 128 bytes, so 128-column chunks fit.
    split = dataclasses.replace(n_1440, m=64)
    assert _reason(space.epilogue_fits_swizzle, split, C(block_m=64, epi_tile_n=128, split_k=2)) is None


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
    # Pinned: a change to the domains or constraints shows up here and in the tuner's budget. Both tile
    # schedules double the grid; at this M neither pad_lhs, nor block_k 32 (K % 64 == 0), nor 32-column
    # epilogue tiles (64-byte bf16 rows) are in it.
    assert (search.size, len(valid)) == (69120, 11232)
    for config in valid:
        assert search.violation(GATE_UP, config, HOPPER) is None
        assert tiling.smem_bytes(GATE_UP, config) <= hardware.ARCHS["9.0"].smem_per_block
    assert all(p.reason for p in pruned)
    assert DEFAULT in valid and dataclasses.replace(DEFAULT, tile_schedule="table") in valid


def test_decode_space_offers_split_k_where_the_experts_column_tiles_leave_sms_idle():
    # Mixtral's down at M=2: about 2 experts x 16 column tiles of 256 against 132 SMs.
    assert space.space(MIXTRAL_DOWN.with_m(2), HOPPER).domains["split_k"] == (1, 2, 4)
    # 8 experts x 112 tiles (N=28672), or DeepSeek-V3's 8 x 28 (N=7168): enough without.
    assert space.space(DECODE, HOPPER).domains["split_k"] == (1,)
    deepseek = Problem("grouped_matmul", m=8, k=2048, n=7168, g=256)
    assert space.space(deepseek, HOPPER).domains["split_k"] == (1,)
    more_sms = dataclasses.replace(HOPPER, core_count=264)
    assert space.space(deepseek, more_sms).domains["split_k"] == (1, 2, 4)


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
    # Four rows per expert: one 64-row tile or a narrower swapped one; 1024 rows: a 128x256 CTA tile.
    assert space.heuristic(DECODE, HOPPER).cta_m <= 64
    assert (space.heuristic(GATE_UP, HOPPER).cta_m, space.heuristic(GATE_UP, HOPPER).cta_n) == (128, 256)


def test_the_seeds_are_the_best_of_several_tile_shapes_heuristic_first():
    swiglu = dataclasses.replace(GATE_UP, op="grouped_matmul_swiglu")
    for problem in (GATE_UP, DECODE, swiglu, QWEN3_DOWN.with_m(8)):
        seeded = space.space(problem, HOPPER)
        assert len(seeded.seeds) == space.SEEDS and seeded.seeds[0] == space.heuristic(problem, HOPPER)
        shapes = {(c.block_m, c.block_n, c.wg_split, c.warp_specialized) for c in seeded.seeds}
        assert len(shapes) == len(seeded.seeds)
        assert all(seeded.contains(c) and seeded.violation(problem, c, HOPPER) is None for c in seeded.seeds)
        # In the ranking's order: the cost model's estimate of a seed is never far above an earlier one's.
        ranked = [c for c, _ in space.ranking(problem, HOPPER)]
        assert [ranked.index(c) for c in seeded.seeds] == sorted(ranked.index(c) for c in seeded.seeds)
    # K=96 (3 x 32) admits no 64- or 128-wide K step: the family ranks 32-wide ones instead of leaving the
    # problem to the always-valid fallback.
    odd = Problem("grouped_matmul", m=8192, k=96, n=4096, g=8)
    seeds = space.space(odd, HOPPER).seeds
    assert len(seeds) == space.SEEDS and all(c.block_k == 32 for c in seeds)
    assert seeds[0] == space.heuristic(odd, HOPPER)


def test_decode_picks_a_grid_whose_busy_sms_can_draw_the_whole_bandwidth():
    """One token over 8 of 128 experts (Qwen3) or 2 of 8 (Mixtral): few column tiles of few experts; the
    pick must keep enough SMs streaming (each SM's port is a fraction of HBM's bandwidth)."""
    facts = hardware.facts("9.0")
    per_sm = facts.sm_port_bytes_per_clock * facts.sustained_clock_hz
    bandwidth = hardware.hbm_bytes_per_s(HOPPER.device_kind, "9.0")
    for problem in (QWEN3_DOWN.with_m(8), QWEN3_GATE_UP.with_m(8), DECODE.with_m(2), MIXTRAL_DOWN.with_m(2)):
        config = space.heuristic(problem, HOPPER)
        estimate = cost.estimate(problem, config, HOPPER)
        assert estimate.sms * per_sm >= bandwidth, (problem, config, estimate)


def test_fine_grained_problems_take_the_table_and_few_groups_the_walk_at_decode():
    # Past WALK_MAX_GROUPS the walk is not in the space. At G=8 and one token the plain CTAs resident
    # beside each other hide the walk, and the table's prologue costs more (mosaic_gpu_cost's tests say
    # how the walk's cost grows with G where nothing hides it).
    for problem in (QWEN3_DOWN.with_m(8), QWEN3_GATE_UP.with_m(8192), QWEN3_DOWN.with_m(32768)):
        assert space.domains(problem, HOPPER)["tile_schedule"] == ("table",)
        assert space.heuristic(problem, HOPPER).tile_schedule == "table"
    assert space.heuristic(MIXTRAL_DOWN.with_m(2), HOPPER).tile_schedule == "walk"
    assert space.domains(MIXTRAL_DOWN, HOPPER)["tile_schedule"] == ("walk", "table")


def test_walk_and_swap_ab_constraints():
    table, walk = C(tile_schedule="table"), C()
    assert "unrolls all G=128 groups" in _reason(space.walk_only_few_groups, QWEN3_DOWN, walk)
    assert _reason(space.walk_only_few_groups, QWEN3_DOWN, table) is None
    assert _reason(space.walk_only_few_groups, MIXTRAL_DOWN, walk) is None
    swapped = C(block_m=16, block_n=128, wg_split="n")
    # 8192 rows over 8 experts: 1024 rows each, far past a 64-row tile.
    assert "rows per expert, not 1024" in _reason(space.swap_ab_only_few_rows, GATE_UP, swapped)
    assert _reason(space.swap_ab_only_few_rows, DECODE, swapped) is None
    f32 = dataclasses.replace(DECODE, out_dtype="float32")
    assert "16-bit outputs only" in _reason(space.swap_ab_output_16bit, f32, swapped)
    assert _reason(space.swap_ab_output_16bit, DECODE, swapped) is None
    assert _reason(space.swap_ab_output_16bit, f32, C(block_m=64)) is None


def test_few_rows_narrow_the_domains():
    few, many = (
        space.domains(QWEN3_DOWN.with_m(1024), HOPPER),
        space.domains(QWEN3_DOWN.with_m(32768), HOPPER),
    )
    assert few["block_m"] == (8, 16, 32, 64) and 128 not in few["block_m"]
    assert "expert" not in few["grid_minor_dim"] and few["epi_tile_m"] == (64,)
    assert many["block_m"] == (64, 128, 192) and "expert" in many["grid_minor_dim"]  # 256 rows: mid-size
    assert space.domains(QWEN3_DOWN.with_m(131072), HOPPER)["block_m"] == (64, 128)
    # Split-K's float32 partial sums fill 128-byte rows at 32 columns; bf16 outputs need 64.
    assert 32 in space.domains(MIXTRAL_DOWN.with_m(2), HOPPER)["epi_tile_n"] and 32 not in few["epi_tile_n"]
    assert space.domains(dataclasses.replace(GATE_UP, k=4096 + 32), HOPPER)["block_k"] == (32, 64, 128)


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


@pytest.mark.parametrize("model", sorted(DEV_MODELS))
def test_a_whole_model_sweeps_a_small_space(model):
    """Every T bucket and both GEMMs of a development model: the driver enumerates each problem's space
    before the sweep starts (about 30 us a point), so each stays small, and a fine-grained model's twelve
    together too (under about 25 s). Every heuristic pick lies in its space and passes every constraint."""
    problems = _model_problems(model)
    sizes = [space.space(p, HOPPER).size for p in problems]
    assert max(sizes) <= 207360, dict(zip(problems, sizes, strict=True))
    if DEV_MODELS[model][0] >= 32:
        assert sum(sizes) <= 750000, sum(sizes)
    for problem in problems:
        config = space.heuristic(problem, HOPPER)
        assert space.space(problem, HOPPER).contains(config)
        assert all(c(problem, config, HOPPER) is None for c in space.CONSTRAINTS), (problem, config)


def test_heuristic_walks_experts_one_after_another_when_compute_bound():
    """The plain GEMM's compute-bound heuristic takes the expert tile order (measured faster under skewed
    routing); SwiGLU takes it up to SWIGLU_EXPERT_ORDER_MAX_ROWS rows per expert and the "m" order above;
    with one row tile per expert the order is "m"."""
    assert space.heuristic(GATE_UP, HOPPER).grid_minor_dim == "expert"
    swiglu = dataclasses.replace(GATE_UP, op="grouped_matmul_swiglu")
    assert swiglu.m / swiglu.g == cost.SWIGLU_EXPERT_ORDER_MAX_ROWS
    assert space.heuristic(swiglu, HOPPER).grid_minor_dim == "expert"
    long_prefill = dataclasses.replace(swiglu, m=2 * swiglu.m)
    assert space.heuristic(long_prefill, HOPPER).grid_minor_dim == "m"
    assert space.heuristic(DECODE, HOPPER).grid_minor_dim == "m"
