"""lab/bench/block_span.py and bench_block.py --span on a CPU: the copies a chain needs, the chain itself
(each block on the previous output and on the next copy of the weights), the slope that makes one
block's span, and the span in a case's record (the GPU's wall clock replaced by a fixed one)."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from moetune_lab.bench import bench_block, block_span, dev_shapes

TINY = dev_shapes.Model("tiny", experts=8, top_k=2, hidden=64, ffn=32)


@pytest.mark.parametrize("touched", [1, 10**6, 16 * 10**6, 75 * 10**6, 704 * 10**6, 10**10])
@pytest.mark.parametrize("l2", [50 * 10**6, 60 * 10**6])
def test_the_blocks_between_two_uses_of_a_copy_read_twice_the_l2(touched, l2):
    count = block_span.copy_count(touched, l2)
    assert count >= 2
    assert (count - 1) * touched >= 2 * l2  # between two uses of a copy, count - 1 blocks run
    if count > 2:
        assert (count - 2) * touched < 2 * l2  # and no more copies than that


def test_copies_past_the_bound_are_refused_with_their_size():
    assert block_span.copies_skip_reason(3, 10**9) is None
    reason = block_span.copies_skip_reason(2, 22 * 10**9)  # DeepSeek-V3's experts, twice
    assert reason == "2 weight copies of 22.0 GB exceed 24 GB"


def test_a_chain_runs_each_block_on_the_previous_output_and_the_next_copy():
    import jax.numpy as jnp

    def block(x, logits, a, b):  # not commutative across copies: the order shows in the result
        return x * a + b + logits

    x, logits = jnp.ones(3), jnp.full(3, 0.5)
    copies = [(jnp.full(3, 2.0), jnp.full(3, 1.0)), (jnp.full(3, 3.0), jnp.full(3, -1.0))]
    got = block_span.chain(block, 3)(x, logits, copies)
    want = block(block(block(x, logits, *copies[0]), logits, *copies[1]), logits, *copies[0])
    np.testing.assert_allclose(np.asarray(got), np.asarray(want))
    assert float(got[0]) == ((1 * 2 + 1.5) * 3 - 0.5) * 2 + 1.5


def fixed_clock(ms_by_blocks):
    """A wall clock that reports, per chain in SPAN_BLOCKS order, a fixed time (the GPU's is not here)."""
    times = iter(ms_by_blocks)

    def clock(fn, args, runs):
        fn(*args)
        return [next(times) * 1e-3] * runs

    return clock


def test_the_span_is_the_slope_over_the_block_counts():
    import jax.numpy as jnp

    short, long = block_span.SPAN_BLOCKS
    clock = fixed_clock([0.05 + 0.02 * short, 0.05 + 0.02 * long])  # 50 us fixed, 20 us a block
    got = block_span.span_ms(lambda x, lg, a, b: x * a + b, jnp.ones(2), jnp.ones(2),
                             [(jnp.ones(2), jnp.ones(2))] * 2, runs=3, clock=clock)  # fmt: skip
    assert got["span_ms"] == pytest.approx(0.02)
    assert got["chain_ms"] == {str(short): pytest.approx(0.05 + 0.02 * short),
                               str(long): pytest.approx(0.05 + 0.02 * long)}  # fmt: skip


def fake_timer(fn, args, runs):
    fn(*args)
    return [1e-3] * runs


def test_a_case_with_spans_records_each_jax_methods_span_and_its_roofline_share():
    short, long = block_span.SPAN_BLOCKS
    methods = ("moetune", "moetune_fused")
    spans = functools.partial(
        bench_block.measure_spans, l2_bytes=1,
        clock=fixed_clock([short * 0.5, long * 0.5] * len(methods)),  # 0.5 ms a block
    )  # fmt: skip
    params = bench_block.parameters(TINY, 16)
    record = bench_block.run_case(
        TINY, 16, params, 2, methods, timer=fake_timer, counter=lambda fn, args: [("k", 1.0)],
        roofline=lambda model, logits: 0.25, spans=spans,
    )  # fmt: skip
    entries = record["methods"]
    assert entries["moetune"]["span_ms"] == pytest.approx(0.5)
    assert entries["moetune"]["span_roofline_share"] == pytest.approx(0.5)
    assert entries["moetune"]["roofline_share"] == 0.25  # the CUPTI time's share stays beside it
    assert "span_ms" not in entries["moetune_fused"]  # no GPU here: skipped, so nothing to chain
    assert "span 0.500 ms" in bench_block.case_line(record)


def test_a_case_whose_copies_do_not_fit_names_why_and_keeps_its_times(monkeypatch):
    monkeypatch.setattr(block_span, "MAX_COPY_BYTES", 1)
    entries = {"moetune": {"median_ms": 1.0}, "torch_grouped_mm": {"median_ms": 2.0}}
    args = bench_block.block_inputs(bench_block.parameters(TINY, 4), 4)
    bench_block.measure_spans(TINY, args, entries, 2, l2_bytes=10**6, clock=fixed_clock([]))
    count = 1 + math.ceil(2 * 10**6 / (bench_block.touched_experts(args[1], 2) * 3 * 64 * 32 * 2))
    assert entries["moetune"]["span_skipped"].startswith(f"{count} weight copies of")
    assert entries["moetune"]["median_ms"] == 1.0 and "span_skipped" not in entries["torch_grouped_mm"]


def test_copies_the_device_cannot_hold_are_an_error_beside_the_kept_times(monkeypatch):
    import jax.numpy as jnp

    args = bench_block.block_inputs(bench_block.parameters(TINY, 4), 4)

    def out_of_memory(*a, **k):
        raise RuntimeError("RESOURCE_EXHAUSTED: out of memory")

    monkeypatch.setattr(jnp, "array", out_of_memory)
    entries = {"moetune": {"median_ms": 1.0}}
    bench_block.measure_spans(TINY, args, entries, 2, l2_bytes=10**6, clock=fixed_clock([]))
    assert entries["moetune"] == {
        "median_ms": 1.0,
        "span_error": "RuntimeError: RESOURCE_EXHAUSTED: out of memory",
    }
