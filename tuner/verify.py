"""Inputs for candidates, and the check every candidate passes before it may be timed.

The check, per routing draw:
  1. poison: a NaN-filled buffer of the output's size is allocated and freed right before the call, so
     the allocator is likely to hand the kernel poisoned memory and rows it forgets to write show up;
  2. rows past sum(group_sizes) must be exactly zero (ragged_dot's contract);
  3. no NaN in the computed rows (NaN never passes, whatever the tolerance);
  4. relative error against the float32 reference within the dtype's tolerance.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from moetune.kernels import reference
from moetune.kernels.errors import WrongResult
from moetune.kernels.problem import Problem

# Timing rotates through input sets whose weights add up to at least this many bytes, so successive
# runs do not find the previous run's weights in cache. Comfortably above current last-level caches
# (H200 L2: 60 MB; MI300X Infinity Cache: 256 MB); a rule of thumb, not a device fact.
ROTATE_BYTES = 512 * 2**20
MAX_INPUT_SETS = 4


def rhs_shape(problem: Problem) -> tuple[int, int, int]:
    return (problem.g, problem.n, problem.k) if problem.transpose_rhs else (problem.g, problem.k, problem.n)


def shape_dtypes(problem: Problem) -> tuple[jax.ShapeDtypeStruct, ...]:
    """The argument shapes a kernel is compiled for: lhs [m, k], rhs, group sizes int32 [g]."""
    return (
        jax.ShapeDtypeStruct((problem.m, problem.k), jnp.dtype(problem.lhs_dtype)),
        jax.ShapeDtypeStruct(rhs_shape(problem), jnp.dtype(problem.rhs_dtype)),
        jax.ShapeDtypeStruct((problem.g,), jnp.int32),
    )


def input_set_count(problem: Problem) -> int:
    weight_bytes = math.prod(rhs_shape(problem)) * jnp.dtype(problem.rhs_dtype).itemsize
    return max(2, min(MAX_INPUT_SETS, -(-ROTATE_BYTES // max(weight_bytes, 1))))


@functools.partial(jax.jit, static_argnames=("shape", "dtype", "scale"))
def _normal(key: jax.Array, shape: tuple[int, ...], dtype: str, scale: float) -> jax.Array:
    # Generated on the device: host-side numpy would take seconds for the largest weights.
    return (jax.random.normal(key, shape, jnp.float32) * scale).astype(dtype)


@dataclasses.dataclass(frozen=True)
class Inputs:
    """Random (never zero) operands for one problem: `sets` of (lhs, rhs) pairs to rotate through."""

    problem: Problem
    seed: int
    sets: tuple[tuple[jax.Array, jax.Array], ...]

    @classmethod
    def make(cls, problem: Problem, seed: int) -> Inputs:
        key = jax.random.key(seed)
        sets = []
        # rhs scaled by 1/sqrt(k) keeps outputs near unit size for every k, so tolerances mean the same.
        for lhs_key, rhs_key in jax.random.split(key, (input_set_count(problem), 2)):
            lhs = _normal(lhs_key, (problem.m, problem.k), problem.lhs_dtype, 1.0)
            rhs = _normal(rhs_key, rhs_shape(problem), problem.rhs_dtype, 1.0 / math.sqrt(problem.k))
            sets.append((lhs, rhs))
        return cls(problem, seed, tuple(sets))

    def arg_sets(self, group_sizes: Sequence[int]) -> list[tuple[jax.Array, jax.Array, jax.Array]]:
        sizes = jnp.asarray(np.asarray(group_sizes, dtype=np.int32))
        return [(lhs, rhs, sizes) for lhs, rhs in self.sets]


class InputCache:
    """Keeps the inputs (and reference outputs) of the most recent problem, so that consecutive candidates
    of a problem reuse them; `trim()` after each task drops them when they exceed `max_bytes`.

    Why the bound: many workers share one GPU, and the largest MoE shapes need gigabytes of inputs and
    references each; cached in every worker they would not fit. Small problems (most of a sweep) stay
    cached; large ones are made again, on the device, which costs milliseconds.
    """

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        self.max_bytes = max_bytes
        self._inputs: Inputs | None = None
        self._references: dict[tuple[int, ...], jax.Array] = {}

    def inputs(self, problem: Problem, seed: int) -> Inputs:
        if self._inputs is None or (self._inputs.problem, self._inputs.seed) != (problem, seed):
            self.clear()
            self._inputs = Inputs.make(problem, seed)
        return self._inputs

    def reference(self, inputs: Inputs, group_sizes: tuple[int, ...]) -> jax.Array:
        if group_sizes not in self._references:
            lhs, rhs, sizes = inputs.arg_sets(group_sizes)[0]
            ref = reference.reference_grouped_matmul(
                lhs, rhs, sizes, transpose_rhs=inputs.problem.transpose_rhs
            )
            self._references[group_sizes] = jax.block_until_ready(ref)
        return self._references[group_sizes]

    @property
    def nbytes(self) -> int:
        held = [a for pair in (self._inputs.sets if self._inputs else ()) for a in pair]
        return sum(a.nbytes for a in held + list(self._references.values()))

    def clear(self) -> None:
        self._inputs = None
        self._references = {}

    def trim(self) -> None:
        if self.nbytes > self.max_bytes:
            self.clear()


def poisoned_call(
    fn: Callable[..., Any], args: tuple, out_shape: tuple[int, ...], out_dtype: Any
) -> jax.Array:
    """Call `fn` right after a NaN-filled buffer of the output's size was allocated and freed."""
    poison = jax.block_until_ready(jnp.full(out_shape, jnp.nan, out_dtype))
    poison.delete()
    return jax.block_until_ready(fn(*args))


def check_output(out: jax.Array, ref: jax.Array, group_sizes: Sequence[int], problem: Problem) -> float:
    """The relative error of `out`; raises WrongResult when it must not pass."""
    expected_shape = (problem.m, problem.n)
    if tuple(out.shape) != expected_shape:
        raise WrongResult(f"output shape {tuple(out.shape)} is not {expected_shape}")
    if jnp.dtype(out.dtype) != jnp.dtype(problem.out_dtype):
        raise WrongResult(f"output dtype {out.dtype} is not {problem.out_dtype}")
    rows = min(int(np.sum(group_sizes)), problem.m)
    # The zero and NaN checks run on the device and bring back only their counts.
    out32 = out.astype(jnp.float32)
    tail_bad = int(jnp.count_nonzero(out32[rows:] != 0))  # NaN != 0, so NaN in the tail counts too
    if tail_bad:
        raise WrongResult(f"{tail_bad} values in rows past sum(group_sizes)={rows} are not zero")
    nans = int(jnp.count_nonzero(jnp.isnan(out32[:rows])))
    if nans:
        raise WrongResult(f"output holds {nans} NaN values in rows [0, {rows})")
    error = float(reference.relative_error(out32[:rows], ref[:rows]))
    limit = reference.tolerance(problem.out_dtype)
    if not error <= limit:
        raise WrongResult(f"relative error {error:.3g} exceeds the {problem.out_dtype} tolerance {limit:g}")
    return error


def verify(
    fn: Callable[..., Any], inputs: Inputs, cache: InputCache, draws: Sequence[tuple[int, ...]]
) -> float:
    """Check `fn` on every draw: the largest relative error, or WrongResult at the first failure."""
    problem = inputs.problem
    worst = 0.0
    for sizes in draws:
        args = inputs.arg_sets(sizes)[0]
        out = poisoned_call(fn, args, (problem.m, problem.n), problem.out_dtype)
        worst = max(worst, check_output(out, cache.reference(inputs, sizes), sizes, problem))
    return worst
