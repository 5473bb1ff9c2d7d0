"""The backend contract base can fail: backends that break one rule each fail the test of that rule."""

from __future__ import annotations

import sys
import types

import jax
import jax.numpy as jnp
import pytest

from moetune.kernels import registry
from tests.kernels.backend_contract import BackendContract, Case
from tests.kernels.conftest import ProbeBackend

CASE = Case("grouped_matmul", "float32")


class _AllRows(ProbeBackend):
    """Multiplies every row lhs holds: breaks the contract on an lhs with rows past m."""

    def build(self, problem, config):
        return lambda lhs, rhs, sizes: jax.lax.ragged_dot(lhs, rhs, sizes)


class _LeavesTheTail(ProbeBackend):
    """Writes ones past sum(group_sizes) instead of zeros."""

    def build(self, problem, config):
        def kernel(lhs, rhs, sizes):
            out = jax.lax.ragged_dot(lhs[: problem.m], rhs, sizes)
            rows = jnp.arange(problem.m)[:, None]
            return jnp.where(rows < jnp.sum(sizes), out, 1.0)

        return kernel


@pytest.fixture
def contract(monkeypatch):
    def make(backend_cls):
        module = types.ModuleType(f"moetune_test_contract_{backend_cls.__name__}")
        module.BACKEND = backend_cls("broken")
        monkeypatch.setitem(sys.modules, module.__name__, module)
        registry.register("broken", module.__name__)

        class Broken(BackendContract):
            backend_name = "broken"

        return Broken()

    yield make
    registry.unregister("broken")


def test_a_backend_reading_rows_past_m_fails_that_test(contract):
    broken = contract(_AllRows)
    broken.test_simple(CASE)  # correct where lhs has m rows
    with pytest.raises(AssertionError):
        broken.test_lhs_with_rows_past_m(CASE)


def test_a_backend_leaving_the_tail_nonzero_fails_that_test(contract):
    broken = contract(_LeavesTheTail)
    broken.test_simple(CASE)
    with pytest.raises(AssertionError):
        broken.test_rows_past_the_groups_are_zero(CASE)


def test_cases_are_the_ops_and_dtypes_a_backend_serves(contract):
    assert contract(_AllRows).served_cases() == [
        Case("grouped_matmul", d) for d in ("bfloat16", "float16", "float32")
    ]
