"""Strategies against one contract (no repeats, warm starts first, exhaustion), and TPE against the grid
on a synthetic space with a known optimum."""

from __future__ import annotations

import dataclasses
import math

import pytest

from moetune.kernels.config import KernelConfig
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.problem import Problem
from moetune.kernels.space import SearchSpace
from moetune.tuner import strategies
from moetune.tuner.strategies import CandidateSpace

DEVICE = DeviceFingerprint("simulated", "cpu", 1, 0, "", "", "", "", "")
PROBLEM = Problem("grouped_matmul", m=4096, k=4096, n=4096, g=8)


@dataclasses.dataclass(frozen=True, slots=True)
class Tiles(KernelConfig):
    block_m: int = 64
    block_n: int = 64
    block_k: int = 64
    stages: int = 2
    order: str = "row"


def fits_in_memory(problem, c: Tiles, device) -> str | None:
    return "too big" if c.block_m * c.block_n * c.stages > 256 * 256 * 2 else None


SPACE = SearchSpace(
    Tiles,
    {
        "block_m": (16, 32, 64, 128, 256),
        "block_n": (16, 32, 64, 128, 256),
        "block_k": (16, 32, 64, 128, 256),
        "stages": (1, 2, 3, 4, 5),
        "order": ("row", "col", "snake"),
    },
    (fits_in_memory,),
)


def synthetic_time(c: Tiles) -> float:
    """A smooth landscape with one optimum (block_m=128, block_n=64, block_k=32, stages=3, snake) and an
    interaction between block_m and block_n, like tiles sharing registers."""
    lm, ln, lk = math.log2(c.block_m), math.log2(c.block_n), math.log2(c.block_k)
    t = 1 + 0.08 * (lm - 7) ** 2 + 0.06 * (ln - 6) ** 2 + 0.05 * (lk - 5) ** 2 + 0.04 * (c.stages - 3) ** 2
    t += 0.03 * (lm - 7) * (ln - 6)
    return t * {"row": 1.0, "col": 1.05, "snake": 0.97}[c.order] * 1e-3


@pytest.fixture(scope="module")
def space():
    return CandidateSpace(SPACE, PROBLEM, DEVICE)


@pytest.fixture(scope="module")
def small_space():
    """Few enough points (about 50) that every strategy can be run to exhaustion quickly."""
    domains = dict(SPACE.domains, block_k=(32, 64), stages=(2, 5), order=("row", "snake"))
    return CandidateSpace(dataclasses.replace(SPACE, domains=domains), PROBLEM, DEVICE)


@pytest.mark.parametrize("name", strategies.names())
def test_contract_no_repeats_warm_first_then_exhausted(name, small_space):
    space = small_space
    valid = space.valid()
    warm = [
        Tiles(128, 64, 32, 5, "snake"),
        Tiles(256, 256, 32, 5),
        Tiles(16, 16, 64, 2),
    ]  # the middle one is pruned
    observed = valid[5]
    strategy = strategies.get(name)(space, seed=1, warm_start=warm)
    strategy.observe(observed, 0.5)
    assert not space.is_valid(warm[1])
    first = strategy.ask(2)
    assert first == [warm[0], warm[2]]
    seen = set(first)
    for config in first:
        strategy.tell(config, synthetic_time(config))
    while not strategy.exhausted:
        batch = strategy.ask(8)
        assert batch, "a strategy that is not exhausted must propose something when asked"
        assert not seen & set(batch) and len(set(batch)) == len(batch)
        assert observed not in batch
        seen |= set(batch)
        for config in batch:
            assert space.is_valid(config)
            strategy.tell(config, synthetic_time(config))
    assert seen | {observed} == set(valid)
    assert strategy.ask(4) == []
    assert strategy.best[0] == min(valid, key=synthetic_time) or strategy.best[1] == 0.5


def test_failed_results_never_count_as_best(space):
    strategy = strategies.get("grid")(space)
    a, b = strategy.ask(2)
    strategy.tell(a, None)
    strategy.tell(b, 2e-3)
    assert strategy.best == (b, 2e-3)


def test_random_order_is_seeded(space):
    order = lambda seed: strategies.get("random")(space, seed=seed).ask(20)  # noqa: E731
    assert order(3) == order(3)
    assert order(3) != order(4)


def test_unknown_strategy_lists_the_known_ones():
    with pytest.raises(ConfigInvalid, match="known: grid, random, tpe"):
        strategies.get("annealing")


def test_tpe_reaches_the_grid_optimum_within_3_percent_in_a_quarter_of_the_trials(space):
    valid = space.valid()
    grid = strategies.get("grid")(space)
    while not grid.exhausted:
        for config in grid.ask(32):
            grid.tell(config, synthetic_time(config))
    grid_best = grid.best[1]
    assert grid_best == min(synthetic_time(c) for c in valid)

    allowed = len(valid) // 4
    for seed in (0, 1, 2):
        tpe = strategies.get("tpe")(space, seed=seed)
        trials = 0
        while trials < allowed and tpe.best is None or (trials < allowed and tpe.best[1] > grid_best * 1.03):
            batch = tpe.ask(4)  # batches, as the driver asks them: one per free worker
            for config in batch:
                tpe.tell(config, synthetic_time(config))
            trials += len(batch)
        assert tpe.best[1] <= grid_best * 1.03, (
            f"seed {seed}: {tpe.best[1]:.4g} after {trials} of {len(valid)} trials"
        )
        assert trials <= allowed


@pytest.mark.parametrize("name", strategies.names())
def test_a_space_too_large_to_enumerate_is_walked_lazily_without_repeats(name, small_space, monkeypatch):
    from moetune.tuner.strategies import base

    valid = small_space.valid()  # enumerated while the limit allows it
    monkeypatch.setattr(base, "ENUMERATION_LIMIT", small_space.space.size - 1)
    large = CandidateSpace(small_space.space, PROBLEM, DEVICE)
    assert not large.enumerable
    with pytest.raises(ConfigInvalid, match="more than the .* a sweep enumerates"):
        large.valid()
    warm = Tiles(128, 64, 32, 5, "snake")
    strategy = strategies.get(name)(large, seed=1, warm_start=[warm])
    seen: list[Tiles] = []
    for _ in range(6):
        batch = strategy.ask(4)
        assert batch and not set(seen) & set(batch) and len(set(batch)) == len(batch)
        assert all(large.is_valid(c) for c in batch)
        seen += batch
        for config in batch:
            strategy.tell(config, synthetic_time(config))
    assert seen[0] == warm
    if name == "grid":  # the lazy walk keeps the enumerated order
        assert seen[1:] == [c for c in valid if c != warm][:23]
    if name == "tpe":  # no count to exhaust: the budget or the time limit ends it
        assert not strategy.exhausted


def test_a_spaces_kernels_name_parameters_of_one_kernel_each():
    from moetune.kernels.space import SearchSpace
    from tests.tuner.two_kernel_backend import TwoKernelConfig

    domains = {"a": (1, 2), "b": (1, 2)}
    assert SearchSpace(TwoKernelConfig, domains, kernels={"first": ("a",), "second": ("b",)}).kernels
    with pytest.raises(ValueError, match="unknown: \\['c'\\]"):
        SearchSpace(TwoKernelConfig, domains, kernels={"first": ("a", "c")})
    with pytest.raises(ValueError, match="at most one kernel"):
        SearchSpace(TwoKernelConfig, domains, kernels={"first": ("a",), "second": ("a", "b")})


def test_kernel_times_count_only_where_every_kernel_of_the_space_was_timed():
    from moetune.kernels.space import SearchSpace
    from tests.tuner.two_kernel_backend import TwoKernelConfig

    space = SearchSpace(
        TwoKernelConfig, {"a": (1, 2), "b": (1, 2)}, kernels={"first": ("a",), "second": ("b",)}
    )
    strategy = strategies.get("grid")(CandidateSpace(space, PROBLEM, DEVICE))
    slow_first, slow_second = TwoKernelConfig(1, 2), TwoKernelConfig(2, 1)
    for config in (slow_first, slow_second):
        strategy.tell(config, 3.0)
    strategy.note_kernels(slow_first, {"first": 2.0})  # the second kernel's time missing: not kept
    assert strategy.recombined() is None
    strategy.note_kernels(slow_first, {"first": 2.0, "second": 1.0, "copy": 0.1})
    strategy.note_kernels(slow_second, {"first": 1.0, "second": 2.0})
    assert strategy.recombined() == TwoKernelConfig(2, 2)
    assert strategy.next_configs(2) == [TwoKernelConfig(2, 2), TwoKernelConfig(1, 1)]
    assert strategy.recombined() is None  # proposed once
