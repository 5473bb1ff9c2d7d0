"""The mosaic_gpu cost model: bounds no estimate may beat, how it responds to the hardware and the
problem, and the family and ranking the heuristic uses. Properties, not measured figures."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from moetune.kernels.backends.mosaic_gpu import cost_model as cost
from moetune.kernels.backends.mosaic_gpu import hardware, space, tiling
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig as C
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import Unsupported
from moetune.kernels.problem import Problem

HOPPER = DeviceFingerprint("NVIDIA H200", "gpu", 132, 0, "9.0", "", "", "", "")
FACTS = hardware.facts("9.0")
QWEN3_DOWN = Problem("grouped_matmul", m=8, k=768, n=2048, g=128)
QWEN3_GATE_UP = Problem("grouped_matmul_swiglu", m=8, k=2048, n=1536, g=128)
MIXTRAL_DOWN = Problem("grouped_matmul", m=2, k=14336, n=4096, g=8)
PREFILL = Problem("grouped_matmul", m=8192, k=4096, n=28672, g=8)
PROBLEMS = [
    QWEN3_DOWN,
    QWEN3_GATE_UP,
    QWEN3_DOWN.with_m(1024),
    QWEN3_GATE_UP.with_m(32768),
    MIXTRAL_DOWN,
    PREFILL,
    Problem("grouped_matmul_swiglu", m=80, k=2048, n=1024, g=512),
]


def _family(problem):
    return cost.family(problem, HOPPER, space.domains(problem, HOPPER))


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: f"{p.op}-m{p.m}-g{p.g}")
def test_no_estimate_beats_the_rooflines(problem):
    """Every config streams at least the touched experts' weights once and multiplies at least the
    problem's FLOPs: no estimate may come in under those bounds at the device's rates."""
    route = cost.uniform_routing(problem)
    weights = route.experts * problem.k * problem.n * 2
    bandwidth = hardware.hbm_bytes_per_s(HOPPER.device_kind, "9.0")
    peak = FACTS.mma_flops_per_clock * FACTS.sustained_clock_hz * HOPPER.core_count
    floor = max(weights / bandwidth, problem.flops / peak)
    for config in _family(problem):
        assert cost.estimate(problem, config, HOPPER).seconds >= floor, config


def test_uniform_routing():
    assert cost.uniform_routing(Problem("grouped_matmul", m=1, k=64, n=64, g=128)) == cost.Routing(1.0, 1.0)
    many = cost.uniform_routing(Problem("grouped_matmul", m=100000, k=64, n=64, g=128))
    assert many.experts == pytest.approx(128) and many.rows == pytest.approx(100000 / 128)
    # Top-8 of 128 experts at one token: a few collisions short of 8.
    assert 7.5 < cost.uniform_routing(QWEN3_DOWN).experts < 8
    assert cost.uniform_routing(dataclasses.replace(QWEN3_DOWN, g=1)) == cost.Routing(1.0, 8.0)


def test_row_tiles_per_expert():
    assert cost.row_tiles_per_expert(1, 64) == cost.row_tiles_per_expert(60, 64) == 1.0
    assert cost.row_tiles_per_expert(256, 128) == pytest.approx((256 + 3.5) / 128 + 0.5)


def test_mma_efficiency_falls_with_a_narrow_n_and_without_warp_specialization():
    by_n = [cost.mma_efficiency(C(block_m=64, block_n=n, wg_split="n"), FACTS) for n in (64, 128, 256)]
    assert by_n == sorted(by_n) and by_n[-1] <= 1
    # Swapped: the tokens are wgmma's N, so 8 rows read a 64x16 A tile for little work.
    swapped = [cost.mma_efficiency(C(block_m=r, block_n=128, wg_split="n"), FACTS) for r in (8, 32)]
    assert swapped[0] < swapped[1] < by_n[0]
    plain = C(block_m=64, block_n=128, warp_specialized=False, wg_split="none")
    assert cost.mma_efficiency(plain, FACTS) < cost.mma_efficiency(C(block_m=64, block_n=128), FACTS)


def test_an_m_split_costs_more_than_the_n_split_of_the_same_cta_tile_only_where_compute_bounds():
    """Two consumers splitting the rows reach less of the tensor cores' rate than two splitting the
    columns of the same 128x128 CTA tile: a compute-bound problem is estimated slower under the M split,
    a memory-bound one (the down GEMM of one token: the weights' read) about the same."""
    by_m = C(
        block_m=64, block_n=128, block_k=128, max_concurrent_steps=2, wg_split="m", tile_schedule="table"
    )
    by_n = dataclasses.replace(by_m, block_m=128, block_n=64, wg_split="n")
    assert (by_m.cta_m, by_m.cta_n) == (by_n.cta_m, by_n.cta_n)
    assert cost.mma_efficiency(by_m, FACTS) < cost.mma_efficiency(by_n, FACTS)
    compute_bound = QWEN3_GATE_UP.with_m(131072)
    m_split, n_split = (cost.estimate(compute_bound, c, HOPPER).seconds for c in (by_m, by_n))
    assert m_split > 1.05 * n_split
    m_split, n_split = (cost.estimate(QWEN3_DOWN, c, HOPPER).seconds for c in (by_m, by_n))
    assert m_split == pytest.approx(n_split, rel=0.02)


def test_resident_ctas_share_an_sm_only_in_plain_grids_of_one_cta_per_item():
    small = C(
        block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, warp_specialized=False, wg_split="none"
    )
    assert cost.resident_ctas(PREFILL, small, FACTS) == 1  # persistent
    assert cost.resident_ctas(PREFILL, dataclasses.replace(small, persistent=False), FACTS) > 1
    ws = dataclasses.replace(small, warp_specialized=True, wg_split="n", persistent=False)
    assert cost.resident_ctas(PREFILL, ws, FACTS) == 1


def test_memory_bound_estimates_follow_the_bandwidth_and_compute_bound_ones_the_sms():
    # DeepSeek-V3's down at one token: 8 experts x 56 column tiles, every SM streaming.
    decode_problem = Problem("grouped_matmul", m=8, k=2048, n=7168, g=256)
    decode = C(
        block_m=64, block_n=64, block_k=128, max_concurrent_steps=4, wg_split="n", tile_schedule="table"
    )
    less_bandwidth = dataclasses.replace(HOPPER, device_kind="NVIDIA H100 80GB HBM3")
    h100, h200 = (cost.estimate(decode_problem, decode, d).seconds for d in (less_bandwidth, HOPPER))
    assert h100 > 1.2 * h200
    prefill = C(block_m=64, block_n=256, block_k=128, max_concurrent_steps=2, wg_split="m")
    half = dataclasses.replace(HOPPER, core_count=66)
    ratio = cost.estimate(PREFILL, prefill, half).seconds / cost.estimate(PREFILL, prefill, HOPPER).seconds
    assert 1.8 < ratio < 2.2
    longer_k = dataclasses.replace(PREFILL, k=2 * PREFILL.k)
    ratio = cost.estimate(longer_k, prefill, HOPPER).seconds / cost.estimate(PREFILL, prefill, HOPPER).seconds
    assert 1.8 < ratio < 2.2


def test_work_items_past_a_multiple_of_the_sms_cost_a_whole_extra_item():
    # One expert, 128-row tiles: 8380 rows take an expected 66 row tiles (the last one half full on
    # average), 2 column tiles of 256 each: 132 items, one per SM; 64 rows more make 133.
    config = C(block_m=64, block_n=256, block_k=128, max_concurrent_steps=2, wg_split="m")
    fits = Problem("grouped_matmul", m=8380, k=8192, n=512, g=1)
    over = fits.with_m(fits.m + 64)
    full, spill = cost.estimate(fits, config, HOPPER), cost.estimate(over, config, HOPPER)
    assert full.items <= HOPPER.core_count < spill.items
    assert spill.seconds > 1.7 * full.seconds


def test_a_memory_bound_last_wave_of_few_items_costs_a_latency_bound_item():
    """One item past two full waves of a memory-bound GEMM runs alone at what its own bytes in flight
    sustain: it costs a real part of a wave, not the 1/265 share of the bandwidth it would get if the
    items spread evenly, and less than the third wave that a full one would cost."""
    config = C(
        block_m=64, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="n", tile_schedule="table"
    )
    # One expert of 56 rows (one row tile) and 256-column CTAs: items = columns / 256.
    seconds = {}
    for items in (264, 265, 396):
        problem = Problem("grouped_matmul", m=56, k=4096, n=256 * items, g=1)
        estimate = cost.estimate(problem, config, HOPPER)
        assert estimate.items == items
        seconds[items] = estimate.seconds
    two_waves, spill, three_waves = seconds[264], seconds[265], seconds[396]
    assert spill - two_waves > 0.2 * (three_waves - two_waves)
    assert spill < three_waves


def test_the_table_pays_for_its_prologue_at_many_experts_and_not_at_eight():
    walk = C(block_m=64, block_n=128, block_k=128, max_concurrent_steps=4, wg_split="n", persistent=False)
    table = dataclasses.replace(walk, tile_schedule="table")
    assert cost.estimate(QWEN3_DOWN, table, HOPPER).seconds < cost.estimate(QWEN3_DOWN, walk, HOPPER).seconds
    assert (
        cost.estimate(MIXTRAL_DOWN, walk, HOPPER).seconds < cost.estimate(MIXTRAL_DOWN, table, HOPPER).seconds
    )
    # The table's persistent loop visits no idle item; the walk's visits the static bound's.
    persistent = dataclasses.replace(table, persistent=True)
    walked = dataclasses.replace(walk, persistent=True)
    assert (
        cost.estimate(QWEN3_DOWN, persistent, HOPPER).items == cost.estimate(QWEN3_DOWN, walked, HOPPER).items
    )
    assert tiling.geometry(QWEN3_DOWN, persistent).tiles < tiling.geometry(QWEN3_DOWN, walked).tiles


def test_the_walk_costs_every_item_a_pass_over_the_groups_that_no_pipeline_hides():
    """The walk's per-item cost over the table grows with the groups it walks, even in a chained
    persistent pipeline (which hides half the table's lookup): at 32 experts and 256 rows each, in the
    expert order, the table is estimated well ahead (on an H200 the walk took 1.37x the table's
    time on such a down GEMM)."""
    walk = C(
        block_m=128, block_n=128, block_k=128, max_concurrent_steps=2, wg_split="n", grid_minor_dim="expert"
    )
    table = dataclasses.replace(walk, tile_schedule="table")
    extra = {}
    for g in (8, 16, 32, 64):
        problem = Problem("grouped_matmul", m=256 * g, k=2048, n=7168, g=g)
        walked, tabled = cost.estimate(problem, walk, HOPPER), cost.estimate(problem, table, HOPPER)
        extra[g] = (walked.seconds - tabled.seconds) / (walked.items / HOPPER.core_count)
        if g == 32:
            assert walked.seconds > 1.2 * tabled.seconds
    assert (
        0 < extra[8]
        and 1.8 * extra[8] < extra[16]
        and 1.8 * extra[16] < extra[32]
        and 1.8 * extra[32] < extra[64]
    )


def test_split_k_and_pad_lhs_cost_their_passes_outside_the_kernel():
    base = C(
        block_m=64, block_n=256, block_k=64, max_concurrent_steps=3, warp_specialized=False, wg_split="none"
    )
    split = dataclasses.replace(base, split_k=4)
    assert (
        cost.estimate(MIXTRAL_DOWN, split, HOPPER).fixed_s > cost.estimate(MIXTRAL_DOWN, base, HOPPER).fixed_s
    )
    # ...and split-K's four times the work items fill the SMs that 2 experts x 16 column tiles leave idle.
    assert (
        cost.estimate(MIXTRAL_DOWN, split, HOPPER).seconds < cost.estimate(MIXTRAL_DOWN, base, HOPPER).seconds
    )
    padded = dataclasses.replace(base, pad_lhs=True)
    assert (
        cost.estimate(MIXTRAL_DOWN, padded, HOPPER).fixed_s
        > cost.estimate(MIXTRAL_DOWN, base, HOPPER).fixed_s
    )


def test_ranking_keeps_the_familys_order_among_near_ties():
    a = C(block_m=64, block_n=128, block_k=128, max_concurrent_steps=4, wg_split="n")
    twin = dataclasses.replace(a, grid_tile_width=4)  # one row tile per expert: the same estimate
    slow = dataclasses.replace(a, block_n=64, max_concurrent_steps=2, warp_specialized=False, wg_split="none")
    estimates = {c: cost.estimate(QWEN3_DOWN, c, HOPPER).seconds for c in (a, twin, slow)}
    assert estimates[a] == estimates[twin] and estimates[slow] > estimates[a] * (1 + cost.TIE)
    for order in ([twin, slow, a], [slow, a, twin]):
        ranked = [c for c, _ in cost.ranked(QWEN3_DOWN, order, HOPPER)]
        ties = [c for c in order if c is not slow]
        assert ranked == [*ties, slow]


def test_family_holds_buildable_configs_and_swapped_tiles_only_for_few_rows():
    for problem in PROBLEMS:
        family = _family(problem)
        assert family and len(set(family)) == len(family)
        for config in family:
            assert tiling.smem_bytes(problem, config) <= FACTS.smem_per_block
        swapped = any(c.swap_ab for c in family)
        assert swapped == (cost.uniform_routing(problem).rows <= cost.FEW_ROWS)
        assert all(c.split_k == 1 for c in family if c.swap_ab)


def test_a_width_of_odd_64s_gets_full_width_tiles_with_a_partial_last_one():
    # gpt-oss's down GEMM: N = 2880 is 45 x 64. A 256-column CTA covers it in 11.25 tiles, the last one a
    # quarter full, and the model counts its zero-filled columns as whole tiles: 2% more tiles than
    # columns, against 64-column tiles' twice as many weight-tile copies per lhs row.
    odd = Problem("grouped_matmul", m=16384 * 4, k=2880, n=2880, g=128)
    ranked = space.ranking(odd, HOPPER)  # the family's configs that every constraint admits, best first
    narrow = [e.seconds for c, e in ranked if c.cta_n == 64]
    pick = space.heuristic(odd, HOPPER)
    assert pick == ranked[0][0] and pick.cta_n >= 128 and odd.n % pick.cta_n
    assert narrow and ranked[0][1].seconds < min(narrow)
    # Where 128-column CTAs divide the width, the family is as it was: no 64-column CTA with a producer.
    for problem in PROBLEMS:
        assert not any(c.cta_n == 64 and c.warp_specialized for c in _family(problem))


def test_a_k_of_odd_32s_gets_wide_k_steps_with_a_partial_last_one():
    # gpt-oss's down GEMM at TP=2: K = 1440 per shard is 45 x 32, 11.25 steps of 128. The last resort,
    # when the ranking is empty, is a two-stage 64x64 tile without a producer.
    last_resort = C(
        block_m=64, block_n=64, block_k=32, max_concurrent_steps=2, warp_specialized=False, wg_split="none"
    )
    for m in (8, 4096, 65536):
        odd = Problem("grouped_matmul", m=m, k=1440, n=2880, g=128)
        ranked = space.ranking(odd, HOPPER)
        assert ranked and space.heuristic(odd, HOPPER) == ranked[0][0]
        assert ranked[0][0].block_k > 32 and odd.k % ranked[0][0].block_k
        assert ranked[0][1].seconds < cost.estimate(odd, last_resort, HOPPER).seconds


def test_a_partial_last_step_or_tile_costs_its_whole_multiplies_and_its_fill():
    # The same tile on K = 1440 (11.25 steps of 128) and on K = 1536 (12 whole steps): the same FLOPs
    # and steps, so about the same time (the fill's bytes cost no less than the real ones'), not 6% less.
    config = C(block_m=128, block_n=128, block_k=128, max_concurrent_steps=2, wg_split="n")
    tail, whole = (Problem("grouped_matmul", m=65536, k=k, n=2816, g=128) for k in (1440, 1536))
    assert tiling.geometry(tail, config).k_steps == tiling.geometry(whole, config).k_steps == 12
    assert cost.estimate(tail, config, HOPPER).seconds > 0.98 * cost.estimate(whole, config, HOPPER).seconds
    # N = 2816 is 11 tiles of 256 columns; 2880 takes a 12th for its last 64.
    wider = dataclasses.replace(tail, n=2880)
    assert cost.estimate(wider, config, HOPPER).seconds > 1.05 * cost.estimate(tail, config, HOPPER).seconds


def test_every_width_and_depth_the_backend_accepts_gets_a_ranked_config():
    # K an odd multiple of 32, of 64, or a multiple of 128; N (F under SwiGLU) likewise of 64 and 128.
    checked = 0
    for op, k, n, m in itertools.product(
        ("grouped_matmul", "grouped_matmul_swiglu"), (1440, 2880, 4096), (2880, 5760, 4096), (8, 4096)
    ):
        problem = Problem(op, m=m, k=k, n=n, g=64)
        try:
            space.check_problem(problem)
        except Unsupported:
            continue
        assert space.ranking(problem, HOPPER), problem
        checked += 1
    assert checked >= 30


DEEPSEEK_BLOCK_GATE_UP = Problem(
    "grouped_matmul_fp8", m=131072, k=7168, n=4096, g=256, lhs_dtype="float8_e4m3fn",
    rhs_dtype="float8_e4m3fn", out_dtype="bfloat16", transpose_rhs=True, scale_layout="block_1x128_128x128",
)  # fmt: skip


def test_staggered_consumers_are_offered_only_where_block_scales_promote():
    assert space.domains(DEEPSEEK_BLOCK_GATE_UP, HOPPER)["stagger_consumers"] == (False, True)
    channel = dataclasses.replace(DEEPSEEK_BLOCK_GATE_UP, scale_layout="row_channel")
    for problem in (channel, PREFILL, QWEN3_DOWN):
        assert space.domains(problem, HOPPER)["stagger_consumers"] == (False,)
        assert not any(c.stagger_consumers for c in _family(problem))
    staggered = [c for c in _family(DEEPSEEK_BLOCK_GATE_UP) if c.stagger_consumers]
    assert staggered and all(c.consumers == 2 for c in staggered)


def test_staggering_hides_at_most_what_the_other_consumer_s_wgmmas_cover(monkeypatch):
    lockstep = C(block_m=64, block_n=64, block_k=128, max_concurrent_steps=2, wg_split="n")
    staggered = dataclasses.replace(lockstep, stagger_consumers=True)
    # Promotions shorter than the wgmmas hide fully, longer ones by half (each consumer promotes while
    # the other multiplies), and nothing is credited until a staggered kernel is timed.
    monkeypatch.setattr(cost, "STAGGER_HIDDEN", 1.0)
    assert cost.multiply_s(staggered, 3.0, 1.0) == 3.0
    assert cost.multiply_s(staggered, 1.0, 3.0) == 2.0
    assert cost.multiply_s(lockstep, 1.0, 3.0) == 4.0
    monkeypatch.setattr(cost, "STAGGER_HIDDEN", 0.5)
    assert cost.multiply_s(staggered, 1.0, 3.0) == 3.0


def test_the_heuristic_staggers_only_once_the_overlap_is_credited(monkeypatch):
    # Uncredited, a staggered config ties its lockstep twin, and a tie keeps the lockstep one.
    monkeypatch.setattr(cost, "STAGGER_HIDDEN", 0.0)
    space.ranking.cache_clear()
    assert not space.heuristic(DEEPSEEK_BLOCK_GATE_UP, HOPPER).stagger_consumers
    monkeypatch.setattr(cost, "STAGGER_HIDDEN", 1.0)
    space.ranking.cache_clear()
    try:
        pick = space.heuristic(DEEPSEEK_BLOCK_GATE_UP, HOPPER)
        lockstep = dataclasses.replace(pick, stagger_consumers=False)
        assert pick.stagger_consumers
        assert cost.estimate(DEEPSEEK_BLOCK_GATE_UP, pick, HOPPER).seconds < (
            cost.estimate(DEEPSEEK_BLOCK_GATE_UP, lockstep, HOPPER).seconds
        )
    finally:
        space.ranking.cache_clear()


QWEN3_T4096 = [QWEN3_GATE_UP.with_m(32768), QWEN3_DOWN.with_m(32768)]  # 256 rows an expert


@pytest.mark.parametrize("problem", QWEN3_T4096, ids=lambda p: p.op)
def test_mid_size_experts_offer_192_row_tiles_to_sweeps_but_not_to_the_heuristic(problem):
    assert cost.FEW_ROWS < cost.uniform_routing(problem).rows <= space.MID_ROWS
    assert 192 in space.domains(problem, HOPPER)["block_m"]
    valid, _ = space.space(problem, HOPPER).enumerate(problem, HOPPER)
    assert any(c.block_m == 192 for c in valid)
    assert not any(c.block_m == 192 for c in _family(problem))
    for other in (problem.with_m(8), problem.with_m(131072)):  # few rows, many rows
        assert 192 not in space.domains(other, HOPPER)["block_m"]
