"""Device-resident operands, float32 references and timing rotations, made once per worker and reused.

The device phase of every candidate is serialised per GPU, so whatever it recomputes per candidate
caps the whole sweep. Everything here depends only on (problem, seed) and the group sizes, never on
the candidate, so a worker makes each thing once and every candidate of that problem reuses it:

  weights     the op's weight operands (OperandSpec `weights`: rhs) depend on their shape and the seed,
              not on M: the problems of one projection at different token counts share them (they
              are most of the bytes);
  inputs      every other drawn operand (lhs; lhs and dout for the weight gradient) plus those weights;
  references  the float32 result for each routing draw (the costliest thing to compute); for outputs
              too large to hold in float32, on a sample of them (`Reference`, `sample_axes`);
  rotations   the argument sets a timer cycles through (copies, for small problems), per timer.

The driver interleaves problems across workers, so the cache holds several problems and evicts the
least recently used ones past `max_bytes`; `trim()` runs after each task.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import sys
from collections.abc import Mapping, Sequence
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


def _nbytes(problem: Problem, operands: Sequence[Any]) -> int:
    return sum(math.prod(o.shape(problem)) * jnp.dtype(o.dtype(problem)).itemsize for o in operands)


def input_set_count(problem: Problem) -> int:
    """Sets whose rotated bytes reach ROTATE_BYTES: the weights' bytes, or for an op without weights
    every drawn operand's (what each run then reads afresh). Depends only on the weights when there
    are any, so problems sharing weights draw the same count of them."""
    drawn = problem.spec.drawn_operands
    rotated = _nbytes(problem, [o for o in drawn if o.weights] or drawn)
    return max(2, min(MAX_INPUT_SETS, -(-ROTATE_BYTES // max(rotated, 1))))


def _set_keys(problem: Problem, seed: int, count: int) -> jax.Array:
    """[count, drawn operands] keys, one per operand of each set (for the grouped GEMM: lhs, rhs)."""
    return jax.random.split(jax.random.key(seed), (count, len(problem.spec.drawn_operands)))


def _weight_indices(problem: Problem) -> list[int]:
    return [i for i, o in enumerate(problem.spec.drawn_operands) if o.weights]


def make_weights(problem: Problem, seed: int) -> tuple[tuple[jax.Array, ...], ...]:
    """The weight operands of every input set, drawn by the op's spec; equal for problems that differ
    only in M."""
    keys, drawn = _set_keys(problem, seed, input_set_count(problem)), problem.spec.drawn_operands
    return tuple(
        tuple(problem.spec.draw(problem, drawn[i].name, kk[i]) for i in _weight_indices(problem))
        for kk in keys
    )


@dataclasses.dataclass(frozen=True)
class Inputs:
    """Random (never zero) operands for one problem, drawn by its op's spec (OpSpec.draw): `sets` to
    rotate through, each the op's drawn operands in call order (for the grouped GEMM: (lhs, rhs); for an
    FP8 op each of them is the pair (values, scale) its spec draws); `call_args` flattens a set into the
    op's call order."""

    problem: Problem
    seed: int
    sets: tuple[tuple[jax.Array, ...], ...]

    @classmethod
    def make(
        cls, problem: Problem, seed: int, weights: Sequence[tuple[jax.Array, ...]] | None = None
    ) -> Inputs:
        """`weights`: the weight operands of each set when already made (make_weights of a problem with
        the same weights)."""
        weights = tuple(weights) if weights is not None else make_weights(problem, seed)
        keys, drawn = _set_keys(problem, seed, len(weights)), problem.spec.drawn_operands
        at_weight = {index: slot for slot, index in enumerate(_weight_indices(problem))}
        sets = tuple(
            tuple(
                shared[at_weight[i]] if i in at_weight else problem.spec.draw(problem, o.name, kk[i])
                for i, o in enumerate(drawn)
            )
            for kk, shared in zip(keys, weights, strict=True)
        )
        return cls(problem, seed, sets)

    def weights(self) -> tuple[tuple[jax.Array, ...], ...]:
        """The weight operands of each set (empty tuples for an op without weights)."""
        indices = _weight_indices(self.problem)
        return tuple(tuple(arrays[i] for i in indices) for arrays in self.sets)

    def call_args(
        self, drawn: tuple[jax.Array, ...], routed: Mapping[str, jax.Array]
    ) -> tuple[jax.Array, ...]:
        """One set's operands with the routing operands of one draw (`routed`, by name: the group sizes, or
        a routed op's router logits) in the op's call order (the kernels' arguments)."""
        arrays = iter(jax.tree.leaves(drawn))  # an FP8 operand is drawn as (values, scale)
        return tuple(
            routed[o.name] if o.kind in ROUTING_KINDS else next(arrays) for o in self.problem.spec.operands
        )


# The operands a routing draw makes rather than the random draw: the group sizes themselves, and a routed
# op's router logits (Operand.from_routing).
ROUTING_KINDS = ("group_sizes", "routing")


def routing_operands(
    problem: Problem, group_sizes: Sequence[int], seed: int, *, grouped: Sequence[int] | None = None
) -> dict[str, jax.Array]:
    """The routing operands of one draw by name: the group sizes as an int32 array (`grouped`, when given,
    in their place: a reference sample's own), a routed op's logits made from `group_sizes`."""
    made = {}
    for operand in problem.spec.operands:
        if operand.kind == "group_sizes":
            made[operand.name] = _group_sizes_array(group_sizes if grouped is None else grouped)
        elif operand.kind == "routing":
            made[operand.name] = jnp.asarray(operand.from_routing(problem, group_sizes, seed))
    return made


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
    """The float32 result on the sample `rows` (sorted indices along the output's sampled axis,
    `sample_axes`): for a row-per-row output [len(rows), out_n] (the op's reference,
    kernels.reference.rows_reference_program)."""

    values: jax.Array
    rows: jax.Array

    @classmethod
    def whole(cls, values: jax.Array) -> Reference:
        """A reference for every row of a row-per-row output."""
        return cls(values, jnp.arange(values.shape[0], dtype=jnp.int32))


def sample_axes(problem: Problem) -> tuple[int, int]:
    """(lhs axis, output axis) a reference sample picks indices along. A row-per-row output: lhs rows,
    one output row each. An output of one slice per expert (`out_grouped`, the weight gradient
    [g, k, n], [g, n, k] transposed): lhs's K columns, one K index of every expert's slice each, so the
    sample's reference is the op's reference on lhs[:, sample] with every row and group size as they are
    (a K index's values depend on lhs's column k alone)."""
    if problem.spec.out_grouped:
        return 1, 2 if problem.transpose_rhs else 1
    return 0, 0


def reference_rows(problem: Problem, group_sizes: Sequence[int], seed: int) -> np.ndarray:
    """The indices to keep a reference for, always `reference_row_count` of them, so that every draw of a
    problem has the same reference shape (one compile of the reference and of the check per problem, not
    per draw). Output rows: every row when that fits, else the first rows when those hold every assigned
    row, else each group's first and last rows plus random assigned ones; rows past sum(group_sizes) have
    a zero reference, and are checked to be zero in any case. K indices of a per-expert output: every
    one when that fits, else random ones drawn anew for each routing draw (a wrong tile of 64 K indices
    escapes a draw with odds (1 - sampled / k)^64: Mixtral-8x7B's gate_up keeps 292 of 4096, 0.9%)."""
    count = reference_row_count(problem)
    if problem.spec.out_grouped:
        if count >= problem.k:
            return np.arange(problem.k, dtype=np.int32)
        draw = np.random.default_rng([seed, *(int(s) for s in group_sizes)])
        picked = draw.choice(problem.k, size=count, replace=False)
        return np.sort(picked).astype(np.int32)
    sizes = np.asarray(group_sizes, dtype=np.int64)
    assigned = int(min(sizes.sum(), problem.m))
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
    """How many indices along the sampled axis (`sample_axes`) every reference of `problem` holds
    (`reference_rows`): as many as fit REFERENCE_MAX_BYTES in float32."""
    lhs_axis, out_axis = sample_axes(problem)
    extent = problem.out_shape[out_axis]
    per_index = math.prod(problem.out_shape) // extent * 4
    return min(extent, max(1, REFERENCE_MAX_BYTES // per_index))


def reference_shape(problem: Problem, count: int) -> tuple[int, ...]:
    """The shape of a reference of `count` sampled indices: the output's, its sampled axis cut."""
    shape = list(problem.out_shape)
    shape[sample_axes(problem)[1]] = count
    return tuple(shape)


def live_slices(problem: Problem, group_sizes: Sequence[int]) -> np.ndarray:
    """Whether each index of the output's first axis may be nonzero: the rows below sum(group_sizes)
    (clipped at m), or for a per-expert output the experts holding rows; the rest must be exactly zero."""
    ends = np.minimum(np.cumsum(np.asarray(group_sizes, dtype=np.int64)), problem.m)
    if problem.spec.out_grouped:
        return np.diff(ends, prepend=0) > 0
    return np.arange(problem.m) < (ends[-1] if len(ends) else 0)


def sampled_group_sizes(group_sizes: Sequence[int], rows: np.ndarray) -> np.ndarray:
    """How many of the sorted `rows` fall in each group: the group sizes of lhs[rows]."""
    ends = np.cumsum(np.asarray(group_sizes, dtype=np.int64))
    return np.diff(np.searchsorted(rows, ends), prepend=0).astype(np.int32)


@dataclasses.dataclass
class _Entry:
    inputs: Inputs
    routed: dict[tuple[int, ...], dict[str, jax.Array]] = dataclasses.field(default_factory=dict)
    references: dict[tuple[int, ...], Reference] = dataclasses.field(default_factory=dict)
    rotations: dict[tuple[tuple[int, ...], Timer], Rotation] = dataclasses.field(default_factory=dict)
    checks_compiled: bool = False  # verify.warm ran for this problem

    def arrays(self) -> list[jax.Array]:
        held = jax.tree.leaves(self.inputs.sets) + jax.tree.leaves(self.routed)
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
            weights = self._shared_weights(problem, seed)
            self._make_room(problem, seed, weights_shared=weights is not None)
            entry = _Entry(Inputs.make(problem, seed, weights))
            self.made["inputs"] += 1
            self._entries[key] = entry
        self._entries.move_to_end(key)
        return entry

    def _shared_weights(self, problem: Problem, seed: int) -> tuple[tuple[jax.Array, ...], ...] | None:
        wanted = weights_key(problem, seed)
        for (other, other_seed), entry in self._entries.items():
            if weights_key(other, other_seed) == wanted:
                return entry.inputs.weights()
        self.made["weights"] += 1
        return None

    def _make_room(self, problem: Problem, seed: int, *, weights_shared: bool) -> None:
        """Before a new problem's operands are drawn: evict the least recently used problems (those not
        holding its weights) until what stays and what it adds fit `max_bytes`. `trim` alone runs after
        a task, so each of the several workers sharing a GPU would peak at its bound plus a whole new
        problem (Qwen3-Next's decode block draws 3 GiB of weights per input set)."""
        drawn = problem.spec.drawn_operands
        adds = input_set_count(problem) * _nbytes(
            problem, [o for o in drawn if not (o.weights and weights_shared)]
        )
        wanted = weights_key(problem, seed)
        for key in [key for key in self._entries if weights_key(*key) != wanted]:
            if self.nbytes + adds <= self.max_bytes:
                return
            del self._entries[key]

    def inputs(self, problem: Problem, seed: int) -> Inputs:
        return self._entry(problem, seed).inputs

    def routed(self, inputs: Inputs, group_sizes: Sequence[int]) -> dict[str, jax.Array]:
        """The routing operands of the draw `group_sizes` (`routing_operands`), made once."""
        entry = self._entry(inputs.problem, inputs.seed)
        sizes = tuple(int(s) for s in group_sizes)
        if sizes not in entry.routed:
            entry.routed[sizes] = routing_operands(inputs.problem, sizes, inputs.seed)
        return entry.routed[sizes]

    def verify_args(self, inputs: Inputs, group_sizes: Sequence[int]) -> tuple[jax.Array, ...]:
        """The operands of the first input set (lhs, rhs, group sizes for the grouped GEMM): what
        candidates are verified on."""
        return inputs.call_args(inputs.sets[0], self.routed(inputs, group_sizes))

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
            problem = inputs.problem
            rows = reference_rows(problem, sizes, inputs.seed)
            # A row sample holds fewer rows per group; a K sample keeps every row. A router's logits are
            # made from the whole draw: the reference samples their rows with lhs's.
            sampled = sampled_group_sizes(sizes, rows) if sample_axes(problem)[0] == 0 else sizes
            routed = routing_operands(problem, sizes, inputs.seed, grouped=sampled)
            lhs, *others = inputs.call_args(inputs.sets[0], routed)
            program = reference.rows_reference_program(problem, len(rows), sample_axes(problem)[0])
            # device_put, not jnp.asarray: a transfer, where asarray may compile a copy program for the
            # shape, and this runs while the worker holds the device.
            ids = jax.device_put(rows)
            values = program(lhs, ids, *others)
            entry.references[sizes] = Reference(jax.block_until_ready(values), ids)
            self.made["reference"] += 1
        return entry.references[sizes]

    def rotation(self, inputs: Inputs, group_sizes: Sequence[int], timer: Timer) -> Rotation:
        """`timer.rotation` of every input set with `group_sizes`, made once per timer: the timer's copies
        (if it makes any) are device memory traffic that no candidate should pay again."""
        entry = self._entry(inputs.problem, inputs.seed)
        key = (tuple(int(s) for s in group_sizes), timer)
        if key not in entry.rotations:
            routed = self.routed(inputs, key[0])
            entry.rotations[key] = timer.rotation([inputs.call_args(drawn, routed) for drawn in inputs.sets])
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

    if not ray.is_initialized() or ray.get_runtime_context().worker.mode != ray.WORKER_MODE:
        return 1.0  # no Ray, or a driver (an inline sweep in a process that also drove a Ray one)
    gpus = ray.get_runtime_context().get_assigned_resources().get("GPU", 0.0)
    return gpus if 0.0 < gpus < 1.0 else 1.0
