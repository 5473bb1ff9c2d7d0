"""Device-resident operands, float32 references and timing rotations, made once per worker and reused.

The device phase of every candidate is serialised per GPU, so whatever it recomputes per candidate
caps the whole sweep. Everything here depends only on (problem, seed) and the group sizes, never on
the candidate, so a worker makes each thing once and every candidate of that problem reuses it:

  weights     rhs sets depend on the rhs shape and the seed, not on M: the problems of one projection
              at different token counts share them (they are most of the bytes);
  inputs      lhs sets plus those weights;
  references  the float32 result for each routing draw (the costliest thing to compute); for outputs
              too large to hold in float32, on a sample of rows (`Reference`);
  rotations   the argument sets a timer cycles through (copies, for small problems), per timer.

The driver interleaves problems across workers, so the cache holds several problems and evicts the
least recently used ones past `max_bytes`; `trim()` runs after each task.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import sys
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from moetune.kernels import reference
from moetune.kernels.device import fingerprint_of
from moetune.kernels.problem import Problem
from moetune.kernels.timing import Rotation, Timer
from moetune.tuner.tasks import weights_key

# Timing rotates through input sets whose weights add up to at least this many bytes, so successive
# runs do not find the previous run's weights in cache. Comfortably above current last-level caches
# (H200 L2: 60 MB; MI300X Infinity Cache: 256 MB); a rule of thumb, not a device fact.
ROTATE_BYTES = 512 * 2**20
MAX_INPUT_SETS = 4
# Without a device memory limit to go by (CPU), what one worker keeps between tasks.
HOST_CACHE_BYTES = 2 << 30
# Of its share of device memory, what a worker may keep between tasks: the rest is for the running
# candidate's output, the verification's temporaries and allocator slack.
DEVICE_CACHE_FRACTION = 0.75


def input_set_count(problem: Problem) -> int:
    rhs = problem.spec.operand("rhs")
    weight_bytes = math.prod(rhs.shape(problem)) * jnp.dtype(rhs.dtype(problem)).itemsize
    return max(2, min(MAX_INPUT_SETS, -(-ROTATE_BYTES // max(weight_bytes, 1))))


def _set_keys(seed: int, count: int) -> jax.Array:
    """[count, 2] keys: (lhs, rhs) of each set. Depends on the count, hence only on the rhs's bytes."""
    return jax.random.split(jax.random.key(seed), (count, 2))


def make_weights(problem: Problem, seed: int) -> tuple[jax.Array, ...]:
    """The rhs of every input set, drawn by the op's spec ((values, scale) for an FP8 op); equal for
    problems that differ only in M."""
    keys = _set_keys(seed, input_set_count(problem))
    return tuple(problem.spec.draw(problem, "rhs", key) for key in keys[:, 1])


@dataclasses.dataclass(frozen=True)
class Inputs:
    """Random (never zero) operands for one problem, drawn by its op's spec (OpSpec.draw): `sets` of
    (lhs, rhs) pairs to rotate through. For an op with scale operands (FP8) each of lhs and rhs is the
    pair (values, scale), as its spec draws them; `call_args` flattens a set into the op's call order."""

    problem: Problem
    seed: int
    sets: tuple[tuple[jax.Array, jax.Array], ...]

    @classmethod
    def make(cls, problem: Problem, seed: int, weights: Sequence[jax.Array] | None = None) -> Inputs:
        """`weights`: the rhs sets when already made (make_weights of a problem with the same rhs)."""
        weights = tuple(weights) if weights is not None else make_weights(problem, seed)
        keys = _set_keys(seed, len(weights))
        lhs = [problem.spec.draw(problem, "lhs", key) for key in keys[:, 0]]
        return cls(problem, seed, tuple(zip(lhs, weights, strict=True)))


def call_args(pair: tuple[Any, Any], group_sizes: jax.Array) -> tuple[jax.Array, ...]:
    """An input set with its group sizes, flat in the op's call order: (lhs, rhs, group sizes), or for an
    FP8 op ((lhs, lhs_scale), (rhs, rhs_scale)) -> (lhs, lhs_scale, rhs, rhs_scale, group sizes)."""
    return (*jax.tree.leaves(pair), group_sizes)


def _group_sizes_array(group_sizes: Sequence[int]) -> jax.Array:
    return jnp.asarray(np.asarray(group_sizes, dtype=np.int32))


# A float32 reference larger than this is kept for a sample of rows only: the largest MoE outputs take
# gigabytes in float32 (Mixtral gate_up at 16384 tokens: 3.8 GB per draw), and every worker on a GPU keeps
# its own. A wrong tile still shows: the sample holds every group's first and last rows and, at the sizes
# where sampling starts, thousands of random rows, so it misses a given 64-row tile with odds below 1e-3.
REFERENCE_MAX_BYTES = 256 * 2**20


@dataclasses.dataclass(frozen=True)
class Reference:
    """The float32 result on the rows `rows` (sorted indices into the output): [len(rows), out_n]
    (the op's reference, kernels.reference.rows_reference_program)."""

    values: jax.Array
    rows: jax.Array

    @classmethod
    def whole(cls, values: jax.Array) -> Reference:
        """A reference for every row of the output."""
        return cls(values, jnp.arange(values.shape[0], dtype=jnp.int32))


def reference_rows(problem: Problem, group_sizes: Sequence[int], seed: int) -> np.ndarray:
    """The output rows to keep a reference for, always min(m, REFERENCE_MAX_BYTES // row bytes) of them,
    so that every draw of a problem has the same reference shape (one compile of the reference and of the
    check per problem, not per draw): every row when that fits, else the first rows when those hold every
    assigned row, else each group's first and last rows plus random assigned ones. Rows past
    sum(group_sizes) have a zero reference, and are checked to be zero in any case."""
    sizes = np.asarray(group_sizes, dtype=np.int64)
    assigned = int(min(sizes.sum(), problem.m))
    count = reference_row_count(problem)
    if assigned <= count:
        return np.arange(count, dtype=np.int32)
    ends = np.minimum(np.cumsum(sizes), assigned)
    starts = ends - np.minimum(sizes, ends)
    edges = np.unique(np.concatenate([starts[sizes > 0], ends[sizes > 0] - 1]))[:count]
    rng = np.random.default_rng(seed)
    others = np.setdiff1d(np.arange(assigned), edges)
    rest = rng.choice(others, size=count - len(edges), replace=False)
    return np.sort(np.concatenate([edges, rest])).astype(np.int32)


def reference_row_count(problem: Problem) -> int:
    """How many output rows every reference of `problem` holds (`reference_rows`)."""
    return min(problem.m, max(1, REFERENCE_MAX_BYTES // (problem.out_n * 4)))


def sampled_group_sizes(group_sizes: Sequence[int], rows: np.ndarray) -> np.ndarray:
    """How many of the sorted `rows` fall in each group: the group sizes of lhs[rows]."""
    ends = np.cumsum(np.asarray(group_sizes, dtype=np.int64))
    return np.diff(np.searchsorted(rows, ends), prepend=0).astype(np.int32)


@dataclasses.dataclass
class _Entry:
    inputs: Inputs
    sizes: dict[tuple[int, ...], jax.Array] = dataclasses.field(default_factory=dict)
    references: dict[tuple[int, ...], Reference] = dataclasses.field(default_factory=dict)
    rotations: dict[tuple[tuple[int, ...], Timer], Rotation] = dataclasses.field(default_factory=dict)
    checks_compiled: bool = False  # verify.warm ran for this problem

    def arrays(self) -> list[jax.Array]:
        held = jax.tree.leaves(self.inputs.sets) + list(self.sizes.values())
        held += [a for ref in self.references.values() for a in (ref.values, ref.rows)]
        held += [leaf for rotation in self.rotations.values() for leaf in jax.tree.leaves(rotation.sets)]
        return held


class InputCache:
    """Per worker: the inputs, references and rotations of recently used problems (see the module doc).

    `made` counts what was computed (inputs, weights, reference, rotation), for tests and diagnostics.
    """

    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = default_max_bytes() if max_bytes is None else max_bytes
        self._entries: collections.OrderedDict[tuple[Problem, int], _Entry] = collections.OrderedDict()
        self.made: collections.Counter[str] = collections.Counter()

    def _entry(self, problem: Problem, seed: int) -> _Entry:
        key = (problem, seed)
        entry = self._entries.get(key)
        if entry is None:
            entry = _Entry(Inputs.make(problem, seed, self._shared_weights(problem, seed)))
            self.made["inputs"] += 1
            self._entries[key] = entry
        self._entries.move_to_end(key)
        return entry

    def _shared_weights(self, problem: Problem, seed: int) -> tuple[jax.Array, ...] | None:
        wanted = weights_key(problem, seed), problem.scale_layout
        for (other, other_seed), entry in self._entries.items():
            # FP8 weights are quantized with their layout's scales: shared within one layout only.
            if (weights_key(other, other_seed), other.scale_layout) == wanted:
                return tuple(rhs for _, rhs in entry.inputs.sets)
        self.made["weights"] += 1
        return None

    def inputs(self, problem: Problem, seed: int) -> Inputs:
        return self._entry(problem, seed).inputs

    def group_sizes(self, inputs: Inputs, group_sizes: Sequence[int]) -> jax.Array:
        """`group_sizes` as an int32 device array, made once."""
        entry = self._entry(inputs.problem, inputs.seed)
        sizes = tuple(int(s) for s in group_sizes)
        if sizes not in entry.sizes:
            entry.sizes[sizes] = _group_sizes_array(sizes)
        return entry.sizes[sizes]

    def verify_args(self, inputs: Inputs, group_sizes: Sequence[int]) -> tuple[jax.Array, ...]:
        """(lhs, rhs, group sizes) of the first input set: what candidates are verified on (with their
        scales in call order for an FP8 op: lhs, lhs_scale, rhs, rhs_scale, group sizes)."""
        return call_args(inputs.sets[0], self.group_sizes(inputs, group_sizes))

    def checks_compiled(self, inputs: Inputs) -> bool:
        """Whether verify.warm compiled this problem's reference and check programs in this worker."""
        return self._entry(inputs.problem, inputs.seed).checks_compiled

    def mark_checks_compiled(self, inputs: Inputs) -> None:
        self._entry(inputs.problem, inputs.seed).checks_compiled = True

    def reference(self, inputs: Inputs, group_sizes: Sequence[int]) -> Reference:
        """The float32 result on `verify_args(inputs, group_sizes)`, on `reference_rows`; once per draw."""
        entry = self._entry(inputs.problem, inputs.seed)
        sizes = tuple(int(s) for s in group_sizes)
        if sizes not in entry.references:
            lhs, *others = jax.tree.leaves(inputs.sets[0])
            rows = reference_rows(inputs.problem, sizes, inputs.seed)
            program = reference.rows_reference_program(inputs.problem, len(rows))
            values = program(lhs, jnp.asarray(rows), *others, jnp.asarray(sampled_group_sizes(sizes, rows)))
            entry.references[sizes] = Reference(jax.block_until_ready(values), jnp.asarray(rows))
            self.made["reference"] += 1
        return entry.references[sizes]

    def rotation(self, inputs: Inputs, group_sizes: Sequence[int], timer: Timer) -> Rotation:
        """`timer.rotation` of every input set with `group_sizes`, made once per timer: the timer's copies
        (if it makes any) are device memory traffic that no candidate should pay again."""
        entry = self._entry(inputs.problem, inputs.seed)
        key = (tuple(int(s) for s in group_sizes), timer)
        if key not in entry.rotations:
            sizes = self.group_sizes(inputs, key[0])
            entry.rotations[key] = timer.rotation([call_args(pair, sizes) for pair in inputs.sets])
            self.made["rotation"] += 1
        return entry.rotations[key]

    @property
    def nbytes(self) -> int:
        # Weights are shared between entries and rotations hold the sets themselves: count each once.
        unique = {id(a): a for entry in self._entries.values() for a in entry.arrays()}
        return sum(int(a.nbytes) for a in unique.values())

    def clear(self) -> None:
        self._entries.clear()

    def trim(self) -> None:
        """Evict the least recently used problems until the cache holds at most `max_bytes`."""
        while self._entries and self.nbytes > self.max_bytes:
            self._entries.popitem(last=False)


def default_max_bytes(device: Any = None, share: float | None = None) -> int:
    """What one worker may keep: a fraction of its share of the device's memory limit (`share`: the
    fraction of the device this process holds; by default Ray's assignment, or all of it)."""
    device = device or jax.devices()[0]
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    # Under XLA_PYTHON_CLIENT_ALLOCATOR=platform (how sweeps share a GPU) jax reports no limit: then the
    # device's total memory, from the driver, is the bound.
    limit = (stats or {}).get("bytes_limit")
    if not limit and getattr(device, "platform", "cpu") != "cpu":
        limit = fingerprint_of(device).memory_bytes
    if not limit:
        return HOST_CACHE_BYTES
    share = device_share() if share is None else share
    return int(limit * share * DEVICE_CACHE_FRACTION)


def device_share() -> float:
    """The fraction of its GPU this process holds: Ray's assignment inside a worker, else all of it."""
    if "ray" not in sys.modules:  # never import Ray just to ask
        return 1.0
    import ray

    if not ray.is_initialized():
        return 1.0
    gpus = ray.get_runtime_context().get_assigned_resources().get("GPU", 0.0)
    return gpus if 0.0 < gpus < 1.0 else 1.0
