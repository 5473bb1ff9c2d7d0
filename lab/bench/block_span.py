"""A block's span on the GPU: from its first kernel's start to its last kernel's end, as a model's layers
see it.

bench_block.py's block times are sums of CUPTI kernel durations. That sum leaves out the gaps between a
block's kernels, and where a kernel is launched while the one before it still runs (programmatic
dependent launch, which XLA turns on for its own kernels on Hopper) it counts the overlap twice. The span
needs neither: two chained programs run the block `SPAN_BLOCKS[0]` and `SPAN_BLOCKS[1]` times in
sequence, each block on the previous one's output and on its own copy of the weights, as a model's layers
run; the slope of their median wall times over the block counts is one block's span. The program's
launch and the host's wait for its end are the same in both and cancel.

The copies keep each block from finding its experts' weights in L2: a chain cycles through enough of
them that the blocks between two uses of one copy read twice the L2.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

SPAN_BLOCKS = (2, 8)
# The weight copies of a chain, all of them together; a model whose copies need more has no span.
MAX_COPY_BYTES = 24 * 10**9


def copy_count(touched_bytes: int, l2_bytes: int) -> int:
    """Weight copies a chain cycles through: 2 at least, and enough that the blocks run between two uses
    of one copy read at least twice the L2 (each reads `touched_bytes`)."""
    return max(2, 1 + math.ceil(2 * l2_bytes / max(touched_bytes, 1)))


def copies_skip_reason(count: int, weight_bytes: int) -> str | None:
    """Why a chain cannot hold `count` copies of weights of `weight_bytes` (None: it can)."""
    if count * weight_bytes <= MAX_COPY_BYTES:
        return None
    return f"{count} weight copies of {weight_bytes / 1e9:.1f} GB exceed {MAX_COPY_BYTES / 1e9:.0f} GB"


def chain(block: Callable, blocks: int) -> Callable:
    """jit of `blocks` runs of block(x, logits, w_gate_up, w_down) in sequence, each on the previous
    run's output and on the next of `copies` ((w_gate_up, w_down) pairs), in turn."""
    import jax

    def run(x, logits, copies):
        for i in range(blocks):
            x = block(x, logits, *copies[i % len(copies)])
        return x

    return jax.jit(run)


def wall_seconds(fn: Callable, args: Sequence, runs: int) -> list[float]:
    """Wall-clock seconds of each of `runs` calls of `fn(*args)`, each waited for, after one call."""
    from moetune.kernels.timing import WallTimer

    return WallTimer(warmup=1).time(fn, [tuple(args)], runs=runs)


def span_ms(block: Callable, x, logits, copies: Sequence, runs: int, clock=wall_seconds) -> dict:
    """{"span_ms": one block's span, "chain_ms": the two chains' median times}: `clock(fn, args, runs)`
    gives the seconds of each call."""
    medians = {}
    for blocks in SPAN_BLOCKS:
        fn = chain(block, blocks).lower(x, logits, copies).compile()
        medians[blocks] = statistics.median(clock(fn, (x, logits, copies), runs)) * 1e3
    short, long = SPAN_BLOCKS
    return {
        "span_ms": (medians[long] - medians[short]) / (long - short),
        "chain_ms": {str(blocks): ms for blocks, ms in medians.items()},
    }
