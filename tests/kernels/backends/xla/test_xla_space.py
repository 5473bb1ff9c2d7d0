"""The xla search space: every constraint prunes what it should and keeps the rest; the heuristic is valid."""

from __future__ import annotations

import dataclasses

import pytest

from moetune.kernels.backends.xla import XlaConfig
from moetune.kernels.backends.xla import space as space_mod
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.problem import Problem

CPU = DeviceFingerprint("cpu", "cpu", 2, 0, "x86_64", "", "", "0.11.2", "0.11.2")
# A made-up accelerator: only its platform and memory size matter here.
GPU = DeviceFingerprint("Test GPU", "gpu", 100, 64 << 30, "9.0", "1.0", "13.0", "0.11.2", "0.11.2")


def problem(m=256, k=64, n=64, g=8, dtype="bfloat16"):
    return Problem("grouped_matmul", m=m, k=k, n=n, g=g, lhs_dtype=dtype, rhs_dtype=dtype, out_dtype=dtype)


def test_chunk_params_only_for_chunked():
    check = space_mod.chunk_params_only_for_chunked
    assert check(problem(), XlaConfig(strategy="segments"), CPU) is None
    assert check(problem(), XlaConfig(strategy="chunked", chunk_m=16, items_per_step=2), CPU) is None
    reason = check(problem(), XlaConfig(strategy="segments", chunk_m=16), CPU)
    assert reason is not None and "only apply to strategy=chunked" in reason
    assert check(problem(), XlaConfig(strategy="ragged_dot", items_per_step=1), CPU) is not None


@pytest.mark.parametrize("strategy", ["dense_masked", "segments"])
def test_all_experts_work_bounded(strategy):
    check = space_mod.all_experts_work_bounded
    config = XlaConfig(strategy=strategy)
    assert check(problem(), config, CPU) is None
    big = problem(m=4096, k=4096, n=14336, g=8)
    assert big.g * big.m * big.k * big.n > space_mod.MAX_ALL_EXPERTS_MACS
    assert "G*M*K*N" in check(big, config, CPU)
    assert check(big, XlaConfig(strategy="chunked"), CPU) is None
    assert check(big, XlaConfig(strategy="ragged_dot"), CPU) is None


def test_dense_products_fit_the_memory_budget():
    check = space_mod.dense_products_fit
    config = XlaConfig(strategy="dense_masked")
    # [M, G, N] float32 products just over the CPU budget, with little work (K=1).
    over = problem(m=space_mod.DEFAULT_MEMORY_BUDGET_BYTES // (4 * 64 * 8) + 1, k=1, n=64, g=8)
    assert "M*G*N" in check(over, config, CPU)
    assert check(problem(), config, CPU) is None
    assert check(over, XlaConfig(strategy="segments"), CPU) is None
    # A device that reports its memory sets the budget (an eighth of it).
    assert check(over, config, GPU) is None


def test_chunk_within_rows():
    check = space_mod.chunk_within_rows
    assert check(problem(m=100), XlaConfig(strategy="chunked", chunk_m=128), CPU) is None
    assert "M=100 rows already fit" in check(problem(m=100), XlaConfig(strategy="chunked", chunk_m=256), CPU)
    # The smallest chunk always stays, however few rows there are.
    assert check(problem(m=1), XlaConfig(strategy="chunked", chunk_m=8), CPU) is None
    assert check(problem(m=1), XlaConfig(strategy="chunked", chunk_m=16), CPU) is not None
    assert check(problem(m=1), XlaConfig(strategy="segments"), CPU) is None


def test_items_per_step_within_items():
    check = space_mod.items_per_step_within_items
    # m=256, chunk_m=64, g=8 -> 4 + 8 - 1 = 11 work items; steps up to 16 differ, 32 is the same as 16.
    assert space_mod.max_work_items(problem(), 64) == 11
    assert check(problem(), XlaConfig(strategy="chunked", chunk_m=64, items_per_step=16), CPU) is None
    assert "only 11 work items" in check(
        problem(), XlaConfig(strategy="chunked", chunk_m=64, items_per_step=32), CPU
    )
    assert check(problem(), XlaConfig(strategy="dense_masked"), CPU) is None


def test_gathered_weights_fit():
    check = space_mod.gathered_weights_fit
    wide = problem(m=4096, k=4096, n=16384, g=64)  # one bf16 expert is 128 MiB
    assert check(wide, XlaConfig(strategy="chunked", items_per_step=8), CPU) is None
    assert "gathers" in check(wide, XlaConfig(strategy="chunked", items_per_step=16), CPU)
    assert check(wide, XlaConfig(strategy="chunked", items_per_step=16), GPU) is None
    assert check(wide, XlaConfig(strategy="segments"), CPU) is None


def test_chunk_params_come_from_their_domains_and_say_validity():
    """A pack's xla config with items_per_step=1000000 is refused (import and dispatch), not only pruned."""
    check = space_mod.chunk_params_in_domain
    p = problem(m=4096, g=8)
    assert check(p, XlaConfig(strategy="chunked", chunk_m=128, items_per_step=8), CPU) is None
    assert "items_per_step=1000000 is not in its domain" in check(
        p, XlaConfig(strategy="chunked", items_per_step=10**6), CPU
    )
    assert "chunk_m=24 is not in its domain" in check(p, XlaConfig(strategy="chunked", chunk_m=24), CPU)
    bad = XlaConfig(strategy="chunked", items_per_step=10**6)
    assert space_mod.space(p, CPU).invalid(p, bad, CPU).startswith("chunk_params_in_domain: ")


def test_every_constraint_is_tested():
    tested = {
        "chunk_params_in_domain",
        "chunk_params_only_for_chunked",
        "all_experts_work_bounded",
        "dense_products_fit",
        "chunk_within_rows",
        "items_per_step_within_items",
        "gathered_weights_fit",
    }
    assert {c.__name__ for c in space_mod.CONSTRAINTS} == tested


def test_enumerate_keeps_each_kernel_once():
    p = problem(m=100, g=4)
    valid, pruned = space_mod.space(p, CPU).enumerate(p, CPU)
    strategies = [c.strategy for c in valid]
    for single in ("ragged_dot", "dense_masked", "segments"):
        assert strategies.count(single) == 1
    chunked = [c for c in valid if c.strategy == "chunked"]
    assert {c.chunk_m for c in chunked} == {8, 16, 32, 64, 128}
    assert len(valid) + len(pruned) == space_mod.space(p, CPU).size
    assert all(space_mod.space(p, CPU).violation(p, c, CPU) is None for c in valid)


def test_large_problems_keep_only_scalable_strategies():
    p = problem(m=8192, k=4096, n=14336, g=8)
    valid, _ = space_mod.space(p, CPU).enumerate(p, CPU)
    assert {c.strategy for c in valid} == {"ragged_dot", "chunked"}


@pytest.mark.parametrize(
    "p",
    [
        problem(m=1, g=1),
        problem(m=7, g=64),
        problem(m=100, g=3),
        problem(m=4096, k=4096, n=14336, g=8),
        problem(m=65536, k=7168, n=4096, g=256),
    ],
    ids=lambda p: p.key,
)
@pytest.mark.parametrize("device", [CPU, GPU], ids=["cpu", "accelerator"])
def test_heuristic_is_a_valid_point(p, device):
    config = space_mod.heuristic(p, device)
    space = space_mod.space(p, device)
    assert space.violation(p, config, device) is None
    assert all(config.to_dict()[name] in values for name, values in space.domains.items())


def test_heuristic_prefers_chunked_on_cpu_and_for_many_rows_elsewhere():
    p = problem(m=2048, g=8)
    assert space_mod.heuristic(p, CPU) == XlaConfig(strategy="chunked", chunk_m=256, items_per_step=8)
    assert space_mod.heuristic(dataclasses.replace(p, m=64, g=64), CPU).chunk_m == 16
    assert space_mod.heuristic(p, GPU) == XlaConfig(strategy="ragged_dot")
    many_rows = dataclasses.replace(p, m=space_mod.ACCELERATOR_CHUNKED_FROM_M * 2)
    assert space_mod.heuristic(many_rows, GPU) == XlaConfig(strategy="chunked", chunk_m=512, items_per_step=4)


@pytest.mark.parametrize("device", [CPU, GPU], ids=["cpu", "accelerator"])
def test_heuristic_falls_back_to_ragged_dot_when_chunked_is_pruned(device):
    # One expert's weights (K*N bf16) larger than the memory budget: no chunked point is valid.
    huge = problem(m=8192, k=1 << 17, n=1 << 17, g=2)
    assert space_mod.heuristic(huge, device) == XlaConfig(strategy="ragged_dot")
