"""The mosaic_gpu backend's fused MoE decode block (op "moe_decode_block"): its Config, its search space's
rules against the kernel's own entry check, its baseline, the cost model and the heuristic on the
development models, and the built kernel in Pallas's interpreter."""

from __future__ import annotations

import dataclasses
import itertools
import sys

import jax
import numpy as np
import pytest

from moetune.kernels import ops, registry
from moetune.kernels.backends.mosaic_gpu import cost_model_decode as cost
from moetune.kernels.backends.mosaic_gpu import hardware
from moetune.kernels.backends.mosaic_gpu import space_decode as space
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig
from moetune.kernels.backends.mosaic_gpu.kernel_decode import DecodeBlockConfig
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import ConfigInvalid, Unsupported
from moetune.kernels.moe import decode_block
from moetune.kernels.ops.moe_decode_block import touched_experts
from moetune.kernels.problem import Problem
from moetune.kernels.reference import reference_of, relative_error
from tests.tiers import each_value_fast

H200 = DeviceFingerprint("NVIDIA H200", "gpu", 132, 150 << 30, "9.0", "", "", "", "")
CPU = DeviceFingerprint("cpu", "cpu", 2, 0, "", "", "", "", "")
# The development models: (experts, top_k, hidden, ffn).
MODELS = {
    "qwen3-30b-a3b": (128, 8, 2048, 768),
    "qwen3-next-80b-a3b": (512, 10, 2048, 512),
    "mixtral-8x7b": (8, 2, 4096, 14336),
}


def _block(tokens, experts, top_k, hidden, ffn, dtype="bfloat16", transpose_rhs=False) -> Problem:
    return Problem(
        "moe_decode_block", tokens, hidden, 2 * ffn, experts, dtype, dtype, dtype, transpose_rhs, top_k=top_k
    )


def test_the_config_is_the_blocks_tiling_and_fused():
    tiling = [f.name for f in dataclasses.fields(decode_block.DecodeConfig)]
    assert [f.name for f in dataclasses.fields(DecodeBlockConfig)] == ["fused", *tiling]
    assert DecodeBlockConfig().decode_config() == decode_block.DecodeConfig()
    assert DecodeBlockConfig.from_json(DecodeBlockConfig(block_h=128).to_json()) == DecodeBlockConfig(
        block_h=128
    )
    with pytest.raises(ConfigInvalid, match="block_f=24 must be a power of two"):
        DecodeBlockConfig(block_f=24)  # DecodeConfig's own rules
    backend = registry.get("mosaic_gpu")
    assert backend.config_class("moe_decode_block") is DecodeBlockConfig
    assert backend.config_class("grouped_matmul") is MosaicGpuConfig
    assert set(backend.config_classes()) == {MosaicGpuConfig, DecodeBlockConfig}


def test_every_tiling_field_has_one_domain_of_values_its_config_takes():
    tiling = {f.name for f in dataclasses.fields(decode_block.DecodeConfig)}
    assert set(space.UP_DOMAINS) | set(space.DOWN_DOMAINS) == tiling  # a new field needs its domain line
    assert not set(space.UP_DOMAINS) & set(space.DOWN_DOMAINS)
    assert list(space.DOMAINS) == ["fused", *space.UP_DOMAINS, *space.DOWN_DOMAINS]
    for name, values in space.DOMAINS.items():
        for value in values:
            DecodeBlockConfig(**{name: value})  # each value passes the Config's own rules


def test_the_spaces_kernels_are_the_blocks_two_pallas_calls_each_with_its_own_fields():
    """The names a CUPTI timer reports for the block's launches, so that a sweep can take each kernel's
    fields from the config that ran it fastest (SearchSpace.kernels)."""
    import inspect

    source = inspect.getsource(decode_block)
    assert list(space.KERNELS) == ["moetune_decode_up", "moetune_decode_down"]
    assert all(f'name="{name}"' in source for name in space.KERNELS)
    assert space.KERNELS == {
        "moetune_decode_up": tuple(space.UP_DOMAINS),
        "moetune_decode_down": tuple(space.DOWN_DOMAINS),
    }
    assert space.space(_block(1, 8, 2, 64, 32), H200).kernels == space.KERNELS


def test_the_space_admits_exactly_what_the_kernels_entry_check_runs():
    problems = [_block(1, 8, 2, 64, 32), _block(5, 16, 4, 96, 48), _block(33, 8, 2, 64, 32)]
    problems.append(_block(32, 128, 11, 2048, 768))  # T * top_k = 352 rows: past the block's bound
    tiles = itertools.product((16, 32, 64), (32, 64), (32, 64), (16, 64), (1, 2, 4))
    params = [dict(block_f=f, block_k=k, block_h=h, block_fd=d, up_split=u) for f, k, h, d, u in tiles]
    for problem, values in itertools.product(problems, params):
        config = DecodeBlockConfig(**values)
        expected = decode_block.unfit_reason(
            problem.m, problem.g, problem.top_k, problem.k, problem.n // 2, config.decode_config()
        )
        assert space.block_fits(problem, config, H200) == expected
        search = space.space(problem, H200)
        assert search.invalid(problem, config, H200) == (
            None if expected is None else f"block_fits: {expected}"
        )


def test_the_baseline_is_the_unfused_path_at_default_tiling():
    problem = _block(8, 128, 8, 2048, 768)
    search = registry.get("mosaic_gpu").search_space(problem, H200)
    assert search.baseline == DecodeBlockConfig(fused=False) == space.BASELINE
    assert search.invalid(problem, space.BASELINE, H200) is None
    assert "leave block_h=128 at its defaults" in search.invalid(
        problem, DecodeBlockConfig(fused=False, block_h=128), H200
    )
    assert not search.contains(space.BASELINE)  # timed apart, not searched


def test_wasteful_points_are_pruned_by_name():
    problem = _block(1, 8, 2, 256, 64)
    deep = DecodeBlockConfig(block_k=128, stages_up=4, block_f=16, block_fd=64, block_h=64)
    assert "stages_up=4 exceeds the 2 K steps" in space.pipeline_depth_useful(problem, deep, H200)
    split = DecodeBlockConfig(block_f=16, block_fd=64, block_h=64, block_k=64, down_split=8)
    assert "down_split=8 exceeds" in space.split_useful(problem, split, H200)  # 2 experts x 1 F step
    big = _block(32, 8, 2, 4096, 512)
    wide = DecodeBlockConfig(block_f=128, block_k=256, stages_up=4)
    assert "bytes of shared memory" in space.smem_fits(big, wide, H200)
    assert "no hardware facts" in space.smem_fits(big, DecodeBlockConfig(), CPU)
    # A batch with a row per warp already routes on the same rows with route_warp_rows as without.
    padded = DecodeBlockConfig(route_warp_rows=True, warps_up=4)
    assert "changes nothing" in space.warp_rows_useful(_block(4, 8, 2, 256, 64), padded, H200)
    assert (
        space.warp_rows_useful(_block(3, 8, 2, 256, 64), dataclasses.replace(padded, warps_up=8), H200)
        is None
    )


def test_problems_no_tiling_runs_are_declined_with_the_kernels_reason():
    backend = registry.get("mosaic_gpu")
    with pytest.raises(Unsupported, match=r"T=33 > 32"):
        backend.check(_block(33, 8, 2, 64, 32))
    with pytest.raises(Unsupported, match=r"F=24 is not a multiple"):
        backend.check(_block(1, 8, 2, 64, 24))
    backend.check(_block(32, 512, 10, 2048, 512))


@pytest.mark.parametrize(*each_value_fast({"model": list(MODELS), "tokens": [1, 8, 32]}))
def test_the_heuristic_picks_a_fitting_fused_config_for_each_development_model(model, tokens):
    problem = _block(tokens, *MODELS[model])
    backend = registry.get("mosaic_gpu")
    config = backend.heuristic(problem, H200)
    assert isinstance(config, DecodeBlockConfig) and config.fused
    search = backend.search_space(problem, H200)
    assert search.violation(problem, config, H200) is None  # every rule, pruning ones included
    assert search.contains(config) and config in search.seeds
    assert decode_block.fits(
        problem.m, problem.g, problem.top_k, problem.k, problem.n // 2, config.decode_config()
    )
    # Never below the touched experts' weights at the HBM read rate.
    estimate = cost.estimate(problem, config.decode_config(), H200)
    floor = touched_experts(problem) * problem.k * (problem.n + problem.n // 2) * 2 / 4.7e12
    assert estimate.seconds > floor
    # The heuristic's pick is the best of the model's estimates of its seeds.
    assert (
        estimate.seconds
        <= min(cost.estimate(problem, c.decode_config(), H200).seconds for c in search.seeds)
        * (1 + space.TIE) ** 2
    )


@pytest.mark.parametrize("shape", [(128, 4, 2880, 2880), (256, 8, 7168, 2048), MODELS["qwen3-30b-a3b"]])
def test_the_heuristic_takes_the_pair_with_the_best_estimate_of_both_kernels(shape):
    # Kernel 2 reads what kernel 1 stores (up_split's float32 partials): gpt-oss-120b's best kernel 1
    # alone costs kernel 2 more than it saves, and a pair ranked by the kernels' own ranks took it.
    problem = _block(1, *shape)
    ranked = space.ranking(problem, H200)
    best = min(estimate.seconds for _, estimate in ranked)
    assert ranked[0][1].seconds <= best * (1 + space.TIE)
    assert ranked[0][1].seconds == cost.estimate(problem, ranked[0][0].decode_config(), H200).seconds


def test_the_cost_model_follows_the_bytes_in_flight_and_the_routing():
    problem = _block(8, 128, 8, 2048, 768)
    shallow = decode_block.DecodeConfig(
        block_f=16, block_k=32, stages_up=2, block_h=32, block_fd=32, stages_down=2
    )
    deep = dataclasses.replace(
        shallow, block_f=64, block_k=128, stages_up=4, block_h=128, block_fd=128, stages_down=4
    )
    assert cost.estimate(problem, deep, H200).seconds < cost.estimate(problem, shallow, H200).seconds
    # Every program of kernel 1 routes the whole batch: 512 experts route slower than 128 at the same tiles.
    wide = _block(32, 512, 8, 2048, 768)
    narrow = _block(32, 128, 8, 2048, 768)
    config = decode_block.DecodeConfig()
    assert cost.up_estimate(wide, config, H200).route_s > 3 * cost.up_estimate(narrow, config, H200).route_s
    # More warps spread the [T, E] routing arrays over more threads, up to the SM's registers: 8 warps
    # spill less than 4, while 16 warps get at most 65536 / 512 = 128 registers a thread and spill more.
    four, eight, sixteen = (dataclasses.replace(config, warps_up=w) for w in (4, 8, 16))
    assert cost.up_estimate(wide, eight, H200).route_s < cost.up_estimate(wide, four, H200).route_s
    assert cost.up_estimate(wide, sixteen, H200).route_s > cost.up_estimate(wide, eight, H200).route_s


def test_kernel_2_issues_the_swiglu_of_up_split_s_partials_at_every_step():
    # With one split kernel 1 stores the hidden rows ready; with more, every warp of kernel 2 adds the
    # splits' partials and applies the SwiGLU to each step's [rows, block_fd] tile before its dot, which
    # at Qwen3-30B-A3B's one token and 64-column tiles takes longer to issue than the tile to arrive.
    problem = _block(1, *MODELS["qwen3-30b-a3b"])
    one = decode_block.DecodeConfig(block_f=64, block_k=128, block_h=64, block_fd=128, down_split=8)
    two, four = dataclasses.replace(one, up_split=2), dataclasses.replace(one, up_split=4)
    chains = [cost.down_estimate(problem, c, H200).chain_s for c in (one, two, four)]
    assert chains[0] < chains[1] < chains[2]
    eight_warps = dataclasses.replace(two, warps_down=8)
    assert cost.down_estimate(problem, eight_warps, H200).chain_s > chains[1]


@pytest.mark.parametrize("shape", [(128, 4, 2880, 2880), MODELS["qwen3-30b-a3b"]])
def test_the_heuristic_pairs_kernel_2_with_each_up_split_it_reads(shape):
    # Kernel 2's best config depends on up_split (its partials' SwiGLU, their shared memory): each split
    # gets kernel 2's ranking given it, so a split whose kernel 2 costs more loses to one that does not.
    # Every split pairs, on 2880 too: its K steps need not divide among the splits.
    problem = _block(1, *shape)
    splits = {config.up_split for config, _ in space.ranking(problem, H200)}
    assert splits == set(space.UP_DOMAINS["up_split"])


def test_kernel_1_s_routing_adds_to_its_stream_where_no_weight_streams_meanwhile():
    # Qwen3-30B-A3B at 8 tokens on a grid of 384 programs, one per SM at a time (three waves): each
    # program routes before its first load, with nothing else on its SM streaming, so the two routings
    # (argmax rounds; ranks, with their T*E^2 compares) differ in the kernel's time by three routings
    # each, although the same stream bounds both.
    problem = _block(8, *MODELS["qwen3-30b-a3b"])
    argmax = decode_block.DecodeConfig(block_f=128, block_k=128, stages_up=4, warps_up=4)
    by_rank = dataclasses.replace(argmax, route_by_rank=True)
    fast, slow = (cost.up_estimate(problem, c, H200) for c in (argmax, by_rank))
    assert slow.resident == fast.resident == 1 and slow.programs == 384
    assert slow.stream_s == fast.stream_s == max(slow.terms)
    assert fast.exposed_s < slow.exposed_s and fast.seconds < slow.seconds
    assert slow.seconds - fast.seconds == pytest.approx(slow.exposed_s - fast.exposed_s)


def test_a_row_per_warp_keeps_argmax_s_reductions_in_a_warp_where_one_holds_a_row():
    # At one token the [1, E] routing arrays lie across kernel 1's warps: argmax's 2k reductions over E
    # cross them. Padded to a row per warp they stay inside one where a warp holds a row (E <= 128):
    # Qwen3-30B-A3B's routing chain shortens by 16 reductions' barriers; Qwen3-Next's 512 experts keep
    # crossing warps and only gain the padding rows' work.
    argmax = decode_block.DecodeConfig(block_f=64, block_k=128, warps_up=4)
    padded = dataclasses.replace(argmax, route_warp_rows=True)
    clock = hardware.facts("9.0").sustained_clock_hz
    saved = 2 * 8 * (cost.REDUCTION_CLOCKS - cost.WARP_REDUCTION_CLOCKS) / clock
    qwen3 = _block(1, *MODELS["qwen3-30b-a3b"])
    one, four = (cost.up_estimate(qwen3, c, H200) for c in (argmax, padded))
    # Three padding rows: their argmax rounds over 128 experts and their slot lookups of 8 choices.
    padding_ops = 3 * 8 * (128 * cost.ROUTE_OPS_PER_ELEMENT + cost.SLOT_OPS_PER_CHOICE)
    added = padding_ops / (4 * cost.LANES_PER_SCHEDULER * clock)
    assert four.exposed_s - one.exposed_s == pytest.approx(added - saved)
    assert four.route_s == pytest.approx(4 * one.route_s)
    wide = _block(1, *MODELS["qwen3-next-80b-a3b"])
    one, four = (cost.up_estimate(wide, c, H200) for c in (argmax, padded))
    padding_ops = 3 * (10 * 512 * cost.ROUTE_OPS_PER_ELEMENT + 16 * cost.SLOT_OPS_PER_CHOICE)
    assert four.exposed_s - one.exposed_s == pytest.approx(
        padding_ops / (4 * cost.LANES_PER_SCHEDULER * clock)
    )
    # A batch of 4 rows on 4 warps needs no padding to keep them in a warp: the same estimate.
    four_tokens = _block(4, *MODELS["qwen3-30b-a3b"])
    assert cost.up_estimate(four_tokens, argmax, H200) == cost.up_estimate(four_tokens, padded, H200)


def _fp8_block(tokens, experts, top_k, hidden, ffn, layout="row_channel") -> Problem:
    return Problem(
        "moe_decode_block_fp8", tokens, hidden, 2 * ffn, experts, "bfloat16", "float8_e4m3fn", "bfloat16",
        transpose_rhs=True, top_k=top_k, scale_layout=layout,
    )  # fmt: skip


def test_fp8_weights_are_read_on_the_sms_at_their_pipes_rates():
    # Qwen3-30B-A3B at one token, 96 programs of kernel 1 (8 experts x 12 F tiles): each value read on
    # those 96 SMs. Triton's conversion to bf16: 1.5 conversions a value at 16 a clock per SM; the
    # integer sequence: 3 integer instructions a value at 64 a clock, half that; f16: the F2FP alone
    # (0.5) and x's 16-row tile (16 / (2 x 128) a weight value), a third of it. 16-bit weights: nothing.
    problem = _fp8_block(1, *MODELS["qwen3-30b-a3b"])
    convert = decode_block.DecodeConfig(block_f=64, block_k=128)
    bits, f16 = (dataclasses.replace(convert, widen_up=m, widen_down=m) for m in ("bits", "f16"))
    slow, fast, narrow = (cost.up_estimate(problem, c, H200) for c in (convert, bits, f16))
    values = touched_experts(problem) * 2048 * 1536
    clock = hardware.facts("9.0").sustained_clock_hz
    assert slow.widen_s == pytest.approx(values * 1.5 / 16 / (96 * clock))
    assert slow.widen_s == pytest.approx(2 * fast.widen_s)
    assert narrow.widen_s == pytest.approx(slow.widen_s * (0.5 + 16 / 256) / 1.5)
    assert slow.widen_s == max(slow.terms) and slow.seconds > fast.seconds  # conversion-bound
    assert cost.up_estimate(_block(1, *MODELS["qwen3-30b-a3b"]), convert, H200).widen_s == 0.0
    assert (
        cost.down_estimate(problem, bits, H200).widen_s < cost.down_estimate(problem, convert, H200).widen_s
    )


def test_kernel_2_s_registers_past_the_ceiling_slow_its_widening():
    # Qwen3-30B-A3B's FP8 block at 32 tokens: 256 x 256 tiles on 4 warps hold ~283 registers a thread
    # (the fitted model; ptxas: 255 and, by f16, 580 bytes spilled, 53 stores and 88 loads a step in the
    # loop); on 8 warps ~172. The same programs widen the same values: the excess slows the 4 warps'.
    problem = _fp8_block(32, *MODELS["qwen3-30b-a3b"])
    four = decode_block.DecodeConfig(block_h=256, block_fd=256, warps_down=4, stages_down=3, widen_down="f16")
    eight = dataclasses.replace(four, warps_down=8)
    registers = (
        cost.DOWN_BASE_REGISTERS
        + cost.DOWN_ACCUMULATOR_REGISTERS * 32 * 256 / 128
        + cost.DOWN_TILE_REGISTERS * 256 * 256 / 128
    )
    assert registers > cost.REGISTERS_PER_THREAD
    slow, fast = (cost.down_estimate(problem, c, H200) for c in (four, eight))
    assert slow.widen_s / fast.widen_s == pytest.approx(registers / cost.REGISTERS_PER_THREAD)
    picked = space.heuristic(problem, H200)
    assert (picked.block_h * picked.block_fd) // (32 * picked.warps_down) < 512  # not the spilling tile


@pytest.mark.parametrize("model", MODELS)
def test_the_widening_fits_the_weights_and_the_heuristic_weighs_it(model):
    fp8, bf16 = _fp8_block(1, *MODELS[model]), _block(1, *MODELS[model])
    for mode in ("bits", "f16"):
        other = DecodeBlockConfig(widen_up=mode, widen_down=mode)
        assert space.widening_fits(fp8, other, H200) is None
        assert "float8" in space.widening_fits(bf16, other, H200)
    assert space.widening_fits(bf16, DecodeBlockConfig(), H200) is None
    # 16-bit weights rank convert only; FP8 ones the mode the model's pipe rates make cheapest.
    assert {(c.widen_up, c.widen_down) for c, _ in space.ranking(bf16, H200)} == {("convert", "convert")}
    picked = space.heuristic(fp8, H200)
    assert (picked.widen_up, picked.widen_down) == ("f16", "f16")


def test_a_thread_holds_what_the_isa_and_the_sm_s_registers_allow():
    facts = hardware.facts("9.0")
    assert [cost.register_ceiling(facts, w) for w in (1, 4, 8, 16)] == [255, 255, 255, 128]


def test_the_cost_model_charges_lines_along_the_weights_contiguous_dimension():
    # [E, H, 2F]: a kernel 1 tile's contiguous runs are block_f wide; K-major [E, 2F, H]: block_k long.
    # Kernel 2 likewise: block_h, block_fd. 16 bf16 values are a quarter of a 128-byte line, 128 a whole
    # one; down_split=16 keeps enough bytes in flight that the line, not the latency, bounds the stream.
    k_by_n, k_major = _block(8, 128, 8, 2048, 768), _block(8, 128, 8, 2048, 768, transpose_rhs=True)
    narrow_n = decode_block.DecodeConfig(block_f=16, block_k=128, block_h=16, block_fd=128, down_split=16)
    narrow_k = decode_block.DecodeConfig(block_f=128, block_k=16, block_h=128, block_fd=16, down_split=16)
    for kernel in (cost.up_estimate, cost.down_estimate):
        assert kernel(k_major, narrow_n, H200).stream_s < kernel(k_by_n, narrow_n, H200).stream_s
        assert kernel(k_by_n, narrow_k, H200).stream_s < kernel(k_major, narrow_k, H200).stream_s
    assert space.heuristic(k_major, H200).fused and not space.block_fits(
        k_major, space.heuristic(k_major, H200), H200
    )


def test_a_device_without_hardware_facts_gets_the_smallest_tiles():
    problem = _block(3, 8, 2, 64, 32)
    assert space.ranking(problem, CPU) == ()
    assert space.heuristic(problem, CPU) == space.SMALLEST
    assert space.SMALLEST.fused and decode_block.fits(3, 8, 2, 64, 32, space.SMALLEST.decode_config())


def test_the_block_is_left_out_of_the_backends_source_hash():
    from moetune.kernels import backend

    assert {"space_decode.py", "cost_model_decode.py"} <= set(backend.UNHASHED_SOURCES)
    assert "kernel_decode.py" not in backend.UNHASHED_SOURCES  # its glue is the backend's kernel code


@pytest.mark.parametrize("transpose_rhs", [False, True])
def test_the_built_kernel_runs_the_block_or_its_baseline_in_the_interpreter(monkeypatch, transpose_rhs):
    # t=1: K-major weights, w_gate_up [E, 2F, H] and w_down [E, H, F]; the baseline's grouped GEMMs
    # are then t=1 problems too.
    problem = _block(3, 8, 2, 64, 32, dtype="float32", transpose_rhs=transpose_rhs)
    backend = registry.get("mosaic_gpu")
    monkeypatch.setattr(sys.modules[type(backend).__module__], "current_fingerprint", lambda: H200)
    spec = ops.get("moe_decode_block")
    keys = jax.random.split(jax.random.key(0), 3)
    x, w_gate_up, w_down = (
        spec.draw(problem, o.name, k) for o, k in zip(spec.drawn_operands, keys, strict=True)
    )
    assert w_gate_up.shape == (8, 64, 64) and w_down.shape == ((8, 64, 32) if transpose_rhs else (8, 32, 64))
    logits = spec.operand("router_logits").from_routing(problem, [1, 1, 0, 1, 1, 1, 0, 1], 0)
    ref = reference_of(problem)(x, logits, w_gate_up, w_down)
    fused = backend.build(problem, space.SMALLEST)
    out = fused(x, logits, w_gate_up, w_down, interpret=True)
    assert relative_error(out, ref) < 1e-5
    unfused = backend.build(problem, space.BASELINE)  # the unfused layer, dispatched on this CPU
    assert relative_error(unfused(x, logits, w_gate_up, w_down), ref) < 1e-5
    with pytest.raises(ConfigInvalid, match="mosaic_gpu needs a DecodeBlockConfig, not MosaicGpuConfig"):
        backend.build(problem, MosaicGpuConfig())
    with pytest.raises(ConfigInvalid, match="block_fits: up_split=4 leaves a split no K step"):
        backend.build(problem, DecodeBlockConfig(block_k=32, up_split=4))
    np.testing.assert_array_equal(np.asarray(out.shape), [3, 64])


def test_tiles_need_not_divide_h_and_f_so_k_major_fp8_reads_whole_lines_on_2880():
    # gpt-oss-120b's H = F = 2880 = 64 x 45. K-major FP8 tiles of 64 rows read 64-byte runs, half a cache
    # line; with a masked last tile the heuristic takes K steps of 128 bytes or more in both kernels.
    problem = _fp8_block(1, 128, 4, 2880, 2880)
    picked = space.heuristic(problem, H200)
    assert picked.block_k >= 128 and picked.block_fd >= 128
    assert 2880 % picked.block_k and 2880 % picked.block_fd
    assert space.block_fits(problem, picked, H200) is None
    # A tile wider than its dim rounded up to a power of two only masks more.
    small = _block(1, 8, 2, 80, 48)
    assert (
        space.tiles_within_dims(small, DecodeBlockConfig(block_h=128, block_f=64, block_fd=64), H200) is None
    )
    assert (
        space.tiles_within_dims(small, DecodeBlockConfig(block_h=256), H200)
        == "block_h=256 is wider than H=80 needs"
    )
    assert "block_f=128" in space.tiles_within_dims(small, DecodeBlockConfig(block_f=128), H200)


def test_swapped_dot_operands_are_swept_on_fp8_weights_only_and_the_heuristic_leaves_them_off():
    # The model has no term for them (MODEL_BLIND): its ranking holds them at False, sweeps time them.
    fp8, bf16 = _fp8_block(32, *MODELS["qwen3-30b-a3b"]), _block(32, *MODELS["qwen3-30b-a3b"])
    swapped = DecodeBlockConfig(swap_ab_up=True)
    assert space.swap_ab_useful(fp8, swapped, H200) is None
    assert space.swap_ab_useful(bf16, swapped, H200) == "swap_ab_up only with FP8 weights"
    assert space.swap_ab_useful(bf16, DecodeBlockConfig(swap_ab_down=True), H200) == (
        "swap_ab_down only with FP8 weights"
    )
    for config, _ in space.ranking(fp8, H200):
        assert not (config.swap_ab_up or config.swap_ab_down)
    assert space.DOMAINS["swap_ab_up"] == space.DOMAINS["swap_ab_down"] == (False, True)
