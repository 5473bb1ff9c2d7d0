"""The correctness contract of every backend's kernels: one test base that each backend's tests subclass,
so that a new backend (or a new op in a backend's table) inherits the whole suite.

Every test runs once per (op, dtype) the backend serves: each op of its `kernels` table, with the
operand dtypes its `check` accepts among bfloat16, float16 and float32. The built kernel's output is
compared with the op's float32 reference (OpSpec.reference) under the op's tolerance for the output dtype,
on operands drawn by the op's own input generator (OpSpec.draw). Cases:
  * simple shapes, every row in some group;
  * empty groups (and one group holding every row);
  * rows past sum(group_sizes): exactly zero (for an op whose output is one slice per expert,
    `OpSpec.out_grouped`, the weight gradient: an expert with no rows is exactly zero);
  * an lhs with more rows than M (kernels/backend.py's contract, the public functions' `rows=`): the
    rows past M are NaN and must not reach the [M, out_n] result;
  * the transposed weight layout rhs [G, N, K];
  * `test_vjp`: for an op whose spec names a VJP, the gradients of the public call (both rhs layouts)
    against jax.vjp of the op's float32 reference; lhs rows past the groups get exactly zero.

A subclass sets `backend_name` and, where needed, overrides `unavailable` (why the kernels cannot run
here: the run tests then skip with that reason) and `configs` (the configs to run; default: the backend's
heuristic on this device).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels import call_op, explain, ops, registry
from moetune.kernels.backend import Backend
from moetune.kernels.config import KernelConfig
from moetune.kernels.device import current_fingerprint
from moetune.kernels.errors import ConfigInvalid, Unsupported
from moetune.kernels.problem import DTYPES, Problem
from moetune.kernels.reference import reference_of, relative_error

# Output columns and K of every case: multiples of every backend's smallest tiles (mosaic_gpu: N % 64,
# K % 32), and small enough for a CPU.
OUT_COLUMNS = 128
K = 128


@dataclasses.dataclass(frozen=True)
class Case:
    op: str
    dtype: str

    def __str__(self) -> str:
        return f"{self.op}-{self.dtype}"

    def problem(self, m: int, g: int, *, transpose_rhs: bool = False) -> Problem:
        n = OUT_COLUMNS * ops.get(self.op).rhs_columns_per_out_column
        return Problem(self.op, m, K, n, g, self.dtype, self.dtype, self.dtype, transpose_rhs)


class BackendContract:
    backend_name: ClassVar[str]

    @property
    def backend(self) -> Backend:
        return registry.get(self.backend_name)

    def unavailable(self) -> str | None:
        """Why this backend's kernels cannot run in this process, or None."""
        return self.backend.available(current_fingerprint())

    def configs(self, problem: Problem) -> list[KernelConfig]:
        return [self.backend.heuristic(problem, current_fingerprint())]

    @classmethod
    def served_cases(cls) -> list[Case]:
        """(op, dtype) pairs the backend serves: its table's ops, with the dtypes its check accepts."""
        backend = registry.get(cls.backend_name)
        cases = []
        for op in sorted(backend.kernels):
            for dtype in DTYPES:
                case = Case(op, dtype)
                try:
                    backend.check(case.problem(m=64, g=4))
                except (Unsupported, ConfigInvalid):  # ConfigInvalid: an FP8 op, which takes no 16-bit
                    continue  # operands (its contract: tests/kernels/test_grouped_matmul_fp8.py)
                cases.append(case)
        return cases

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "case" in metafunc.fixturenames:
            metafunc.parametrize("case", self.served_cases(), ids=str)

    # -- the cases ------------------------------------------------------------------------------------

    def test_serves_at_least_one_case(self):
        assert self.served_cases(), f"{self.backend_name} serves no (op, dtype) of {DTYPES}"

    def test_simple(self, case: Case):
        self._check(case.problem(m=40, g=4), [10, 7, 13, 10])

    def test_empty_groups(self, case: Case):
        self._check(case.problem(m=40, g=4), [0, 25, 0, 15])
        self._check(case.problem(m=40, g=4), [0, 0, 40, 0])

    def test_rows_past_the_groups_are_zero(self, case: Case):
        self._check(case.problem(m=40, g=4), [5, 0, 9, 3])
        self._check(case.problem(m=40, g=4), [0, 0, 0, 0])

    def test_transposed_rhs(self, case: Case):
        self._check(case.problem(m=40, g=4, transpose_rhs=True), [10, 0, 21, 4])

    def test_lhs_with_rows_past_m(self, case: Case):
        problem = case.problem(m=40, g=4)
        lhs, rhs = self._operands(problem)
        padded = jnp.concatenate([lhs, jnp.full((24, problem.k), jnp.nan, lhs.dtype)])
        sizes = jnp.asarray([10, 7, 13, 6], jnp.int32)
        ref = reference_of(problem)(lhs, rhs, sizes)
        for config in self._runnable_configs(problem):
            out = jax.jit(self.backend.build(problem, config))(padded, rhs, sizes)
            self._assert_matches(problem, out, ref, sizes, config=config)
            # The public functions' `rows=`: the key's M is `rows`, and this backend serves it.
            chosen = explain(problem, backend=self.backend_name, config=config)
            assert chosen.backend == self.backend_name and not chosen.declined, chosen
            out = call_op(
                problem.op, padded, rhs, sizes, rows=problem.m, backend=self.backend_name, config=config
            )
            self._assert_matches(problem, out, ref, sizes, config=config)

    @pytest.mark.parametrize("transpose_rhs", [False, True], ids=["kn", "nk"])
    def test_vjp(self, case: Case, transpose_rhs: bool):
        spec = ops.get(case.op)
        if spec.vjp is None:
            pytest.skip(f"{case.op} has no VJP (OpSpec.vjp is None)")
        problem = case.problem(m=40, g=4, transpose_rhs=transpose_rhs)
        lhs, rhs = self._operands(problem)
        sizes = jnp.asarray([10, 0, 21, 4], jnp.int32)
        dout = jax.random.normal(jax.random.key(7), problem.out_shape, jnp.float32)
        f32 = [x.astype(jnp.float32) for x in (lhs, rhs)]
        _, reference_vjp = jax.vjp(
            lambda a, b: spec.reference(a, b, sizes, transpose_rhs=transpose_rhs), *f32
        )
        want = reference_vjp(dout)
        for config in self._runnable_configs(problem):
            # The cotangents are their own problems; a backend that serves only the forward passes them on.
            def call(a, b, config=config):
                return call_op(
                    problem.op,
                    a,
                    b,
                    sizes,
                    transpose_rhs,
                    backend=self.backend_name,
                    config=config,
                    fallback=True,
                )

            _, vjp = jax.vjp(call, lhs, rhs)
            got = vjp(dout.astype(problem.out_dtype))
            for name, cotangent, primal, ref in zip(("dlhs", "drhs"), got, (lhs, rhs), want, strict=True):
                assert cotangent.shape == primal.shape and cotangent.dtype == primal.dtype, name
                error = relative_error(cotangent, ref)
                limit = spec.tolerance_for(problem.out_dtype)
                assert error <= limit, (
                    f"{problem.key} {config}: {name} relative error {error:.3g} > {limit:g}"
                )
            assert not np.any(np.asarray(got[0][35:], np.float32)), f"{problem.key} {config}: dlhs tail rows"

    # -- running a case -------------------------------------------------------------------------------

    def _runnable_configs(self, problem: Problem) -> list[KernelConfig]:
        reason = self.unavailable()
        if reason is not None:
            pytest.skip(f"{self.backend_name} cannot run here: {reason}")
        return self.configs(problem)

    @staticmethod
    def _operands(problem: Problem, seed: int = 0) -> tuple[Any, ...]:
        """The op's drawn operands (lhs and rhs, or lhs and dout), in call order."""
        spec = problem.spec
        drawn = [o.name for o in spec.operands if o.stddev is not None]
        keys = jax.random.split(jax.random.key(seed), len(drawn))
        return tuple(spec.draw(problem, name, key) for name, key in zip(drawn, keys, strict=True))

    def _check(self, problem: Problem, group_sizes: list[int]) -> None:
        lhs, rhs = self._operands(problem, seed=sum(group_sizes))
        sizes = jnp.asarray(group_sizes, jnp.int32)
        ref = reference_of(problem)(lhs, rhs, sizes)
        for config in self._runnable_configs(problem):
            out = jax.jit(self.backend.build(problem, config))(lhs, rhs, sizes)
            self._assert_matches(problem, out, ref, sizes, config=config)

    @staticmethod
    def _assert_matches(problem: Problem, out: Any, ref: Any, group_sizes: Any, config=None) -> None:
        assert tuple(out.shape) == problem.out_shape, (out.shape, problem.out_shape)
        assert jnp.dtype(out.dtype) == jnp.dtype(problem.out_dtype)
        error = relative_error(out, ref)
        limit = problem.spec.tolerance_for(problem.out_dtype)
        assert error <= limit, f"{problem.key} {config}: relative error {error:.3g} > {limit:g}"
        ends = np.minimum(np.cumsum(np.asarray(group_sizes)), problem.m)
        if problem.spec.out_grouped:
            # An expert with no rows has a gradient of exactly zero, not merely a small one.
            empty = np.diff(ends, prepend=0) == 0
            assert not np.any(np.asarray(out, np.float32)[empty]), f"{problem.key} {config}: empty experts"
        else:
            # ragged_dot's contract: rows past sum(group_sizes) are exactly zero, not merely small.
            assert not np.any(np.asarray(out[ends[-1] :], np.float32)), f"{problem.key} {config}: tail rows"
