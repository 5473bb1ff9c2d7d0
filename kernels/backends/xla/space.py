"""Search space, constraints and heuristic default of the `xla` backend (kernels/backends/xla/).

Each constraint is a plain function (problem, config, device) -> None or the reason the point is pruned;
the pruner, XlaBackend.build and the tests call these same functions. The limits here are software
cut-offs on wasted work and memory, not hardware facts: the device's memory, when the fingerprint knows
it, sets the memory budget.
"""

from __future__ import annotations

from moetune.kernels.backends.xla.config import DEFAULT_CHUNK_M, DEFAULT_ITEMS_PER_STEP, STRATEGIES, XlaConfig
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.problem import FP8_DTYPES, Problem
from moetune.kernels.space import SearchSpace

CHUNK_M = (8, 16, 32, 64, 128, 256, 512)
ITEMS_PER_STEP = (1, 2, 4, 8, 16, 32, 64)

# dense_masked and segments multiply every row by every expert: G times the useful work. Past this many
# multiply-adds (~7e10, seconds on a CPU) they cannot win against chunked or ragged_dot.
MAX_ALL_EXPERTS_MACS = 1 << 36
# Used when the fingerprint reports no memory size (CPU): one intermediate may take at most this much.
DEFAULT_MEMORY_BUDGET_BYTES = 1 << 30
# FP8 weights: xla multiplies bf16 or (block scales) float32 copies of them, so the larger.
_ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4} | dict.fromkeys(FP8_DTYPES, 4)


def _pow2_ceil(value: int) -> int:
    return 1 << max(0, value - 1).bit_length()


def _memory_budget(device: DeviceFingerprint) -> int:
    # An eighth of device memory leaves room for the operands, the output and the rest of the model.
    return device.memory_bytes // 8 if device.memory_bytes > 0 else DEFAULT_MEMORY_BUDGET_BYTES


def max_work_items(problem: Problem, chunk_m: int) -> int:
    """Static number of (row chunk, group) work items of the chunked strategy: chunks + G - 1."""
    return -(-problem.m // chunk_m) + problem.g - 1


def chunk_params_in_domain(problem: Problem, config: XlaConfig, device: DeviceFingerprint) -> str | None:
    # Validity: the chunk parameters come from their domains, so a pack cannot carry a value no sweep
    # tries (items_per_step=1000000: a loop step gathering a million expert matrices).
    for name, domain in (("chunk_m", CHUNK_M), ("items_per_step", ITEMS_PER_STEP)):
        value = getattr(config, name)
        if value not in domain:
            return f"{name}={value} is not in its domain {', '.join(map(str, domain))}"
    return None


def chunk_params_only_for_chunked(
    problem: Problem, config: XlaConfig, device: DeviceFingerprint
) -> str | None:
    if config.strategy == "chunked":
        return None
    if (config.chunk_m, config.items_per_step) != (DEFAULT_CHUNK_M, DEFAULT_ITEMS_PER_STEP):
        return (
            f"chunk_m={config.chunk_m}, items_per_step={config.items_per_step} only apply to "
            f"strategy=chunked (strategy={config.strategy} keeps the defaults {DEFAULT_CHUNK_M}, "
            f"{DEFAULT_ITEMS_PER_STEP})"
        )
    return None


def all_experts_work_bounded(problem: Problem, config: XlaConfig, device: DeviceFingerprint) -> str | None:
    if config.strategy not in ("dense_masked", "segments"):
        return None
    macs = problem.g * problem.m * problem.k * problem.n
    if macs > MAX_ALL_EXPERTS_MACS:
        return f"strategy={config.strategy} does G*M*K*N={macs} multiply-adds > {MAX_ALL_EXPERTS_MACS}"
    return None


def dense_products_fit(problem: Problem, config: XlaConfig, device: DeviceFingerprint) -> str | None:
    if config.strategy != "dense_masked":
        return None
    # The [M, G, N] float32 products of every row with every expert exist at once.
    size = problem.m * problem.g * problem.n * 4
    budget = _memory_budget(device)
    if size > budget:
        return f"strategy=dense_masked holds M*G*N float32 products ({size} bytes) > budget {budget} bytes"
    return None


def chunk_within_rows(problem: Problem, config: XlaConfig, device: DeviceFingerprint) -> str | None:
    if config.strategy != "chunked":
        return None
    # A chunk larger than the smallest allowed one that holds all M rows only multiplies padding.
    largest_useful = max(CHUNK_M[0], _pow2_ceil(problem.m))
    if config.chunk_m > largest_useful:
        return f"chunk_m={config.chunk_m} > {largest_useful}: M={problem.m} rows already fit in one chunk"
    return None


def items_per_step_within_items(problem: Problem, config: XlaConfig, device: DeviceFingerprint) -> str | None:
    if config.strategy != "chunked":
        return None
    # Steps larger than all the work items are the same kernel as one step holding them all.
    items = max_work_items(problem, config.chunk_m)
    if config.items_per_step > _pow2_ceil(items):
        return f"items_per_step={config.items_per_step} > {_pow2_ceil(items)}: only {items} work items"
    return None


def gathered_weights_fit(problem: Problem, config: XlaConfig, device: DeviceFingerprint) -> str | None:
    if config.strategy != "chunked":
        return None
    # Each step gathers one [K, N] expert matrix per work item.
    size = config.items_per_step * problem.k * problem.n * _ITEMSIZE[problem.rhs_dtype]
    budget = _memory_budget(device)
    if size > budget:
        return (
            f"items_per_step={config.items_per_step} gathers {size} bytes of weights > budget {budget} bytes"
        )
    return None


CONSTRAINTS = (
    chunk_params_in_domain,
    chunk_params_only_for_chunked,
    all_experts_work_bounded,
    dense_products_fit,
    chunk_within_rows,
    items_per_step_within_items,
    gathered_weights_fit,
)


def space(problem: Problem, device: DeviceFingerprint) -> SearchSpace:
    return SearchSpace(
        config_cls=XlaConfig,
        domains={"strategy": STRATEGIES, "chunk_m": CHUNK_M, "items_per_step": ITEMS_PER_STEP},
        constraints=CONSTRAINTS,
        validity=(chunk_params_in_domain,),
    )


# On accelerators XLA's ragged_dot won below this many rows (H200, bf16: M=64..1024, G=8..128).
ACCELERATOR_CHUNKED_FROM_M = 4096


def heuristic(problem: Problem, device: DeviceFingerprint) -> XlaConfig:
    """The chunked strategy with chunks near the mean group size, where it measured faster; else ragged_dot.

    Empirical, jax 0.11, bf16. 2-core CPU: chunked beat ragged_dot 1.2-16x from M=512 up (ragged_dot's
    CPU lowering multiplies every row by every expert), best chunk_m near M/G. H200: ragged_dot won for
    M <= 1024; at M=4096, G=64 and M=8192, G=8 chunked won 3x and 1.8x, best chunk_m about 2*M/G.
    """
    mean_group = max(1, problem.m // problem.g)
    if device.platform == "cpu":
        chunk_m, items = min(max(16, _pow2_ceil(mean_group)), 256), DEFAULT_ITEMS_PER_STEP
    elif problem.m >= ACCELERATOR_CHUNKED_FROM_M:
        chunk_m, items = min(max(128, 2 * _pow2_ceil(mean_group)), 512), 4
    else:
        return XlaConfig(strategy="ragged_dot")
    chunk_m = min(chunk_m, max(CHUNK_M[0], _pow2_ceil(problem.m)))
    items = min(items, _pow2_ceil(max_work_items(problem, chunk_m)))
    config = XlaConfig(strategy="chunked", chunk_m=chunk_m, items_per_step=items)
    if space(problem, device).violation(problem, config, device) is not None:
        return XlaConfig(strategy="ragged_dot")
    return config
