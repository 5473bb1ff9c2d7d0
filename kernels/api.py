"""The public kernel API: `grouped_matmul`, `grouped_matmul_swiglu` and `call_op` for any registered op
(moetune.kernels.ops) (trace-time dispatch), their FP8 forms with scale operands (`grouped_matmul_fp8`,
`grouped_matmul_swiglu_fp8`, `call_scaled_op`), and `explain` (the same decision, told). Each op is its own
Problem key, tuned and looked up separately; so is each op of a gradient (`grouped_matmul`'s VJP calls
the grouped GEMM with the other rhs layout and the weight-gradient op, dispatched like any call).

At trace time a call turns its static shapes into a Problem, picks a backend (explicit argument, or the
backend of an explicit config > $MOETUNE_BACKEND > the highest-priority backend available on the device),
asks the winner lookup for that backend's config and builds the kernel.

A backend that was named (argument, config or $MOETUNE_BACKEND) and cannot run the call (not available
on the device, or Unsupported from check or build) raises Unsupported saying why: a caller who asked for
mosaic_gpu never gets xla's ragged_dot without knowing. Only when no backend is named, or the caller
passes `fallback=True`, does a backend that declines pass the call to the next available backend by
priority, ending with xla; when every backend declines, one ExceptionGroup carries every reason
(`fallback=False` makes the default choice strict too). The jitted program holds only the kernel: the
lookup runs in Python while tracing, so a function jax has already traced keeps the config it was traced
with (new winners reach it after the trace is redone, e.g. in a new process).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp

from moetune.kernels import ops, registry
from moetune.kernels.backend import Backend, KernelFn
from moetune.kernels.config import KernelConfig
from moetune.kernels.device import DeviceFingerprint, current_fingerprint
from moetune.kernels.errors import ConfigInvalid, UnknownBackend, Unsupported
from moetune.kernels.lookup import LOOKUP, Resolution
from moetune.kernels.ops import fp8_scales
from moetune.kernels.problem import GROUPED_MATMUL, GROUPED_MATMUL_SWIGLU, Problem, problem_of

log = logging.getLogger(__name__)

OP = GROUPED_MATMUL
ENV_BACKEND = "MOETUNE_BACKEND"
# Runs everywhere, so it closes every fallback chain.
LAST_RESORT_BACKEND = "xla"
DEFAULT_REASON = "highest-priority backend available on this device"


@dataclasses.dataclass(frozen=True)
class Explanation:
    """Which backend and config a call gets, and why.

    `backend_reason` says why the first backend was asked; `declined` lists "name: reason" for every
    backend that declined before `backend` accepted.
    """

    problem: Problem
    device: DeviceFingerprint
    backend: str
    backend_reason: str
    config: KernelConfig
    source: str
    from_m: int | None
    stale: tuple[str, ...]
    declined: tuple[str, ...]
    median_s: float | None = None  # the winner's tuned time, when it came from a tuned winner
    # What the heuristic planned with, when the config is the heuristic's (e.g. which part's calibration
    # fitted the backend's cost model, and whether it is another part's).
    heuristic_basis: str | None = None

    @property
    def resolution(self) -> Resolution:
        return Resolution(self.backend, self.config, self.source, self.from_m, self.stale, self.median_s)

    def to_dict(self) -> dict[str, Any]:
        return {
            "problem": self.problem.key,
            "device_kind": self.device.device_kind,
            "fingerprint": self.device.hash,
            "backend": self.backend,
            "backend_reason": self.backend_reason,
            "config": self.config.to_dict(),
            "source": self.source,
            "from_m": self.from_m,
            "stale": list(self.stale),
            "declined": list(self.declined),
            "median_s": self.median_s,
            "heuristic_basis": self.heuristic_basis,
        }

    def __str__(self) -> str:
        source = self.source if self.from_m is None else f"{self.source} (from m={self.from_m})"
        if self.median_s is not None:
            source += f", tuned at {self.median_s * 1e3:.4g} ms"
        if self.heuristic_basis is not None:
            source += f" ({self.heuristic_basis})"
        lines = [
            f"problem:  {self.problem.key}",
            f"device:   {self.device.device_kind} (fingerprint {self.device.hash})",
            f"backend:  {self.backend} ({self.backend_reason})",
            f"config:   {self.config}",
            f"source:   {source}",
            f"stale:    {'yes: ' + '; '.join(self.stale) if self.stale else 'no'}",
        ]
        lines += [f"declined: {reason}" for reason in self.declined]
        return "\n".join(lines)


def grouped_matmul(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    transpose_rhs: bool = False,
    preferred_element_type: Any = None,
    backend: str | None = None,
    config: KernelConfig | None = None,
    rows: int | None = None,
    fallback: bool | None = None,
    group_offset: Any = None,
) -> jax.Array:
    """out[M, N]: each contiguous group of lhs[M, K]'s rows times its expert's rhs[G, K, N], as
    jax.lax.ragged_dot computes it (rows past sum(group_sizes) are zero; rhs is [G, N, K] when
    `transpose_rhs`).

    `backend` and `config` override the choice and the lookup; the config's type names its backend. A
    named backend (or $MOETUNE_BACKEND) that cannot run the call raises Unsupported saying why, unless
    `fallback=True` lets the next backend by priority take it (the default when none is named;
    `fallback=False` makes the default choice strict too). Works under jax.jit and inside shard_map,
    where the per-shard shapes make the key. `rows` is M when lhs carries rows past it that belong to no
    group (a producer's padding, e.g. to a kernel's tile; contents ignored): the result is [M, N] and the
    key's M is `rows`. Every backend's kernel takes such an lhs as
    it is (the contract in kernels/backend.py): mosaic_gpu's pad_lhs configs use the padding instead of
    copying lhs into a padded buffer; xla computes on the first M rows.

    `group_offset` ((1,) int32, jax.lax.ragged_dot's): rhs holds the local slice of experts
    [offset, offset + G) of group_sizes' G_total (expert parallelism): rows of other experts are zero.
    The key is the local problem's (m, G); backends that cannot serve it decline (the xla backend can).
    """
    return call_op(
        OP, lhs, rhs, group_sizes, transpose_rhs, preferred_element_type, backend, config, rows, fallback,
        group_offset,
    )  # fmt: skip


def grouped_matmul_swiglu(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    transpose_rhs: bool = False,
    preferred_element_type: Any = None,
    backend: str | None = None,
    config: KernelConfig | None = None,
    rows: int | None = None,
    fallback: bool | None = None,
    group_offset: Any = None,
) -> jax.Array:
    """out[M, F] = silu(h[:, :F]) * h[:, F:] with h = grouped_matmul(lhs, rhs [G, K, 2F]) in float32.

    The MoE gate_up projection and its SwiGLU in one op (gate columns first, then up). A backend that
    fuses it never writes h to memory; the others (xla) compute h in float32, then the activation.
    Rows past sum(group_sizes) are zero. Arguments as for `grouped_matmul`, `rows`, `fallback` and
    `group_offset` included.
    """
    op = GROUPED_MATMUL_SWIGLU
    return call_op(
        op, lhs, rhs, group_sizes, transpose_rhs, preferred_element_type, backend, config, rows, fallback,
        group_offset,
    )  # fmt: skip


def call_op(
    op: str,
    lhs: Any,
    rhs: Any,
    group_sizes: Any,
    transpose_rhs: bool = False,
    preferred_element_type: Any = None,
    backend: str | None = None,
    config: KernelConfig | None = None,
    rows: int | None = None,
    fallback: bool | None = None,
    group_offset: Any = None,
    experts: int | None = None,
) -> jax.Array:
    """The registered op `op` (moetune.kernels.ops; e.g. "grouped_matmul_geglu") on lhs [M, K], rhs and
    group_sizes, dispatched as `grouped_matmul` is; arguments as for `grouped_matmul`, `rows`,
    `fallback` and `group_offset` included. `experts`: the local slice's expert count under
    `group_offset` for an op whose output is one slice per expert (the weight gradient), whose operands
    do not hold it.
    Raises ConfigInvalid for an unknown op, listing the registered ones."""
    lhs, rhs, group_sizes = jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes)
    row_start = None
    if group_offset is not None:
        group_sizes, row_start = _local_slice(op, lhs, rhs, group_sizes, group_offset, transpose_rhs, experts)
    return _call(
        op, lhs, rhs, group_sizes, row_start, transpose_rhs, preferred_element_type, backend, config, rows,
        fallback,
    )  # fmt: skip


def _local_slice(
    op: str, lhs: Any, rhs: Any, group_sizes: Any, group_offset: Any, transpose_rhs: bool, experts: int | None
) -> tuple[jax.Array, jax.Array]:
    """jax.lax.ragged_dot's group_offset as the local problem: the local experts' group sizes
    group_sizes[offset : offset + G] and the row their first group starts at (the rows of the experts
    before the slice), which kernels take as `row_start`."""
    spec = ops.get(op)
    if spec.out_grouped and experts is None:
        raise ValueError(f"{op} under group_offset needs experts= (the local slice's expert count)")
    stand_in = None if experts is None else jax.ShapeDtypeStruct((experts,), jnp.int32)
    _, _, _, local = spec.dims_of(lhs, rhs, stand_in, transpose_rhs)
    if group_sizes.ndim != 1 or not local <= group_sizes.shape[0]:
        raise ValueError(
            f"group_offset: group_sizes {tuple(group_sizes.shape)} must be [G_total] with G_total >= the "
            f"{local} local experts"
        )
    offset = jnp.asarray(group_offset, jnp.int32)
    if offset.size != 1:
        raise ValueError(f"group_offset must be a (1,) array, as jax.lax.ragged_dot's; got {offset.shape}")
    offset = offset.reshape(())
    sizes = group_sizes.astype(jnp.int32)
    before = jnp.sum(jnp.where(jnp.arange(sizes.shape[0]) < offset, sizes, 0)).astype(jnp.int32)
    return jax.lax.dynamic_slice(sizes, (offset,), (local,)), before


def _call(
    op: str,
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    row_start: jax.Array | None,
    transpose_rhs: bool,
    preferred_element_type: Any,
    backend: str | None,
    config: KernelConfig | None,
    rows: int | None,
    fallback: bool | None,
) -> jax.Array:
    """`call_op` on a local problem: the groups start at `row_start` (None: row 0)."""
    if rows is not None and not (lhs.ndim == 2 and 0 < rows <= lhs.shape[0]):
        raise ValueError(f"rows={rows} must be between 1 and the {lhs.shape[0]} rows of lhs {lhs.shape}")
    slack = rows is not None and rows < lhs.shape[0]
    problem = problem_of(
        jax.ShapeDtypeStruct((rows, lhs.shape[1]), lhs.dtype) if slack else lhs,
        rhs,
        group_sizes,
        transpose_rhs=transpose_rhs,
        preferred_element_type=preferred_element_type,
        op=op,
    )
    explanation, kernel = _use(problem, backend, config, fallback, sliced=row_start is not None)
    if group_sizes.dtype != jnp.int32:
        group_sizes = group_sizes.astype(jnp.int32)
    if problem.spec.vjp is None:
        return _run(kernel, lhs, rhs, group_sizes, row_start=row_start)
    # The backward follows the forward's choice of backend (a config names its backend), not its config:
    # each cotangent is its own Problem with its own winner.
    named = backend if backend is not None or config is None else explanation.backend
    operands = _varying_alike(lhs, rhs, group_sizes, row_start)
    return _differentiable(kernel, problem, named, fallback)(*operands)


def _varying_alike(*arrays: Any) -> tuple[Any, ...]:
    """Inside shard_map (check_vma), the arrays cast to vary over the same mesh axes (a no-op outside):
    a custom VJP's cotangents must have its primals' types, and each cotangent mixes every operand's
    axes (an expert slice's rows and replicated tokens). jax transposes the cast into the sum over the
    axes an operand did not vary over, which is the cotangent a replicated operand is owed."""
    axes = frozenset().union(*(_varying_axes(a) for a in arrays if a is not None))
    return tuple(
        a if a is None else jax.lax.pcast(a, tuple(sorted(axes - _varying_axes(a))), to="varying")
        for a in arrays
    )


def _varying_axes(array: Any) -> frozenset:
    # jax 0.11 keeps the mesh axes a value varies over in its type's manual axis type.
    return jax.typeof(array).mat.varying


def _run(kernel: KernelFn, *operands: Any, row_start: Any) -> jax.Array:
    """The kernel on its operands, with `row_start` only for a local slice (a kernel without one need not
    take it)."""
    if row_start is None:
        return kernel(*operands)
    return kernel(*operands, row_start=row_start)


def grouped_matmul_fp8(
    lhs: jax.Array,
    lhs_scale: jax.Array,
    rhs: jax.Array,
    rhs_scale: jax.Array,
    group_sizes: jax.Array,
    *,
    scale_layout: str,
    transpose_rhs: bool = False,
    preferred_element_type: Any = None,
    backend: str | None = None,
    config: KernelConfig | None = None,
    fallback: bool | None = None,
    group_offset: Any = None,
) -> jax.Array:
    """out[M, N] = grouped_matmul of the dequantized operands: lhs [M, K] and rhs [G, K, N] (or [G, N, K])
    in float8_e4m3fn or float8_e5m2, each times its float32 scale in `scale_layout` ("tensor",
    "row_channel", "block_1x128_128x128"; kernels/ops/fp8_scales.py gives the shapes), accumulated in
    float32, bf16 unless `preferred_element_type` says otherwise.

    The layout is part of the Problem key: each layout is tuned and looked up apart. A scale of the wrong
    shape or dtype raises ConfigInvalid at trace time naming it and the shape it needs; a backend that
    cannot serve the layout declines (Unsupported) and the call falls through as `grouped_matmul`'s does
    (`backend`, `config`, `fallback` and `group_offset` as there: rhs and its scale then hold the local
    slice of experts). No gradient (an inference op).
    """
    return call_scaled_op(
        ops.GROUPED_MATMUL_FP8, lhs, lhs_scale, rhs, rhs_scale, group_sizes, scale_layout=scale_layout,
        transpose_rhs=transpose_rhs, preferred_element_type=preferred_element_type, backend=backend,
        config=config, fallback=fallback, group_offset=group_offset,
    )  # fmt: skip


def grouped_matmul_swiglu_fp8(
    lhs: jax.Array,
    lhs_scale: jax.Array,
    rhs: jax.Array,
    rhs_scale: jax.Array,
    group_sizes: jax.Array,
    *,
    scale_layout: str,
    **options: Any,
) -> jax.Array:
    """out[M, F] = silu(h[:, :F]) * h[:, F:] with h the float32 product of `grouped_matmul_fp8` into
    rhs [G, K, 2F]; the keyword `options` (transpose_rhs, preferred_element_type, backend, config,
    fallback, group_offset) as there."""
    return call_scaled_op(
        ops.GROUPED_MATMUL_SWIGLU_FP8, lhs, lhs_scale, rhs, rhs_scale, group_sizes,
        scale_layout=scale_layout, **options,
    )  # fmt: skip


def call_scaled_op(
    op: str,
    lhs: Any,
    lhs_scale: Any,
    rhs: Any,
    rhs_scale: Any,
    group_sizes: Any,
    *,
    scale_layout: str,
    transpose_rhs: bool = False,
    preferred_element_type: Any = None,
    backend: str | None = None,
    config: KernelConfig | None = None,
    fallback: bool | None = None,
    group_offset: Any = None,
) -> jax.Array:
    """The registered op `op` with scale operands (an FP8 op) on lhs, lhs_scale, rhs, rhs_scale and
    group_sizes, dispatched as `call_op` dispatches (`group_offset` included: rhs and rhs_scale hold the
    local slice of experts); the scales are checked against `scale_layout` first."""
    lhs, rhs, group_sizes = jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes)
    lhs_scale, rhs_scale = jnp.asarray(lhs_scale), jnp.asarray(rhs_scale)
    row_start = None
    if group_offset is not None:
        group_sizes, row_start = _local_slice(op, lhs, rhs, group_sizes, group_offset, transpose_rhs, None)
    problem = problem_of(
        lhs,
        rhs,
        group_sizes,
        transpose_rhs=transpose_rhs,
        preferred_element_type=preferred_element_type,
        op=op,
        scale_layout=scale_layout,
    )
    fp8_scales.check_scales(problem, lhs_scale, rhs_scale)
    _, kernel = _use(problem, backend, config, fallback, sliced=row_start is not None)
    return _run(kernel, lhs, lhs_scale, rhs, rhs_scale, group_sizes.astype(jnp.int32), row_start=row_start)


def _use(
    problem: Problem,
    backend: str | None,
    config: KernelConfig | None,
    fallback: bool | None,
    *,
    sliced: bool = False,
) -> tuple[Explanation, KernelFn]:
    """The kernel dispatch picks for a call of `problem`, the use noted (a miss is counted); `sliced` as
    _dispatch's."""
    device = current_fingerprint()
    explanation, kernel = _dispatch(
        problem, backend=backend, config=config, device=device, fallback=fallback, sliced=sliced
    )
    note_use(explanation)
    return explanation, kernel


def note_use(explanation: Explanation) -> None:
    """What dispatch does with a decision it uses: a miss or a stale winner is noted (LOOKUP.note_use) and
    every recording() gets the decision. For a decision made beside `call_op` as well: moe_mlp's choice of
    its fused decode block."""
    problem = explanation.problem
    LOOKUP.note_use(problem, explanation.resolution, explanation.device)
    log.debug("%s -> %s %s (%s)", problem.key, explanation.backend, explanation.config, explanation.source)
    with _RECORDING_LOCK:
        for calls in _RECORDINGS:
            calls.append(explanation)


_RECORDINGS: list[list[Explanation]] = []
_RECORDING_LOCK = threading.Lock()


@contextlib.contextmanager
def recording() -> Iterator[list[Explanation]]:
    """The dispatch decisions made while the block runs, in order, as Explanations: what a model ran.
    Dispatch happens when a call is traced, so record the first call of a jitted function (a later call
    of the same compiled function dispatches nothing). Recordings nest; each sees every decision.

        with moetune.kernels.recording() as calls:
            jax.block_until_ready(step(params, batch))
        print({(c.problem.op, c.backend) for c in calls})
    """
    calls: list[Explanation] = []
    with _RECORDING_LOCK:
        _RECORDINGS.append(calls)
    try:
        yield calls
    finally:
        with _RECORDING_LOCK:
            _RECORDINGS.remove(calls)


def _differentiable(kernel: KernelFn, problem: Problem, backend: str | None, fallback: bool | None):
    """`kernel` with a VJP made of the ops its spec names (OpSpec.vjp), each dispatched as its own
    Problem: dlhs = dh @ rhs[g]^T (the other rhs layout), drhs = lhs[rows of g]^T @ dh[rows of g], where
    dh is the output's cotangent, or under a gated epilogue the cotangent of its float32 product h,
    which the backward recomputes (`Vjp.product`) rather than the forward keeping [M, 2F] of it.
    Rows of lhs past the groups (and past `problem.m`) get a zero cotangent, the group sizes none."""
    spec, vjp, transpose_rhs = problem.spec, problem.spec.vjp, problem.transpose_rhs

    @jax.custom_vjp
    def op(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, row_start: Any) -> jax.Array:
        return _run(kernel, lhs, rhs, group_sizes, row_start=row_start)

    def forward(lhs, rhs, group_sizes, row_start):
        return _run(kernel, lhs, rhs, group_sizes, row_start=row_start), (lhs, rhs, group_sizes, row_start)

    def backward(residuals, dout):
        lhs, rhs, group_sizes, row_start = residuals
        local = functools.partial(_call, group_sizes=group_sizes, row_start=row_start, backend=backend)
        # lhs may carry rows past m (`rows=`): they belong to no group.
        rows = problem.m if lhs.shape[0] > problem.m else None
        if vjp.product:
            # Imported here: the moe package imports this module.
            from moetune.kernels.moe.reference import gated_activation

            product = local(
                vjp.product, lhs, rhs, transpose_rhs=transpose_rhs, preferred_element_type=jnp.float32,
                config=None, rows=rows, fallback=fallback,
            )  # fmt: skip
            _, epilogue_vjp = jax.vjp(functools.partial(gated_activation, spec.epilogue), product)
            (dproduct,) = epilogue_vjp(dout.astype(jnp.float32))
            # The GEMMs of the cotangent run in the operands' dtype, as the forward's did.
            dout = dproduct.astype(jnp.result_type(lhs.dtype, rhs.dtype))
        dlhs = local(
            vjp.dlhs, dout, rhs, transpose_rhs=not transpose_rhs, preferred_element_type=lhs.dtype,
            config=None, rows=None, fallback=fallback,
        )  # fmt: skip
        if rows is not None:
            dlhs = jnp.pad(dlhs, ((0, lhs.shape[0] - rows), (0, 0)))
        drhs = local(
            vjp.drhs, lhs, dout, transpose_rhs=transpose_rhs, preferred_element_type=rhs.dtype,
            config=None, rows=rows, fallback=fallback,
        )  # fmt: skip
        return dlhs, drhs, None, None

    op.defvjp(forward, backward)
    return op


def cotangent_problems(problem: Problem) -> list[tuple[str, Problem]]:
    """The Problems the backward of `problem` dispatches (`_differentiable`), by part: "product" (a gated
    op's float32 product, recomputed), "dlhs" (the grouped GEMM with the other rhs layout: k and n
    swapped) and "drhs" (the weight gradient); [] for an op without a gradient. What `moetune tune
    --with-backward` plans, so that training finds every GEMM of its step tuned. The cotangent the
    GEMMs take is in the output's dtype, or under a gated epilogue in the operands' promoted dtype."""
    vjp = problem.spec.vjp
    if vjp is None:
        return []
    same = dict(m=problem.m, g=problem.g)
    dout_dtype = problem.out_dtype
    parts = []
    if vjp.product:
        dout_dtype = jnp.result_type(problem.lhs_dtype, problem.rhs_dtype).name
        parts.append(("product", dataclasses.replace(problem, op=vjp.product, out_dtype="float32")))
    dlhs = Problem(
        vjp.dlhs, k=problem.n, n=problem.k, lhs_dtype=dout_dtype, rhs_dtype=problem.rhs_dtype,
        out_dtype=problem.lhs_dtype, transpose_rhs=not problem.transpose_rhs, **same,
    )  # fmt: skip
    drhs = Problem(
        vjp.drhs, k=problem.k, n=problem.n, lhs_dtype=problem.lhs_dtype, rhs_dtype=dout_dtype,
        out_dtype=problem.rhs_dtype, transpose_rhs=problem.transpose_rhs, **same,
    )  # fmt: skip
    return [*parts, ("dlhs", dlhs), ("drhs", drhs)]


def explain(
    problem_or_lhs: Problem | Any,
    rhs: Any = None,
    group_sizes: Any = None,
    *,
    transpose_rhs: bool = False,
    preferred_element_type: Any = None,
    backend: str | None = None,
    config: KernelConfig | None = None,
    device: DeviceFingerprint | None = None,
    op: str = OP,
    fallback: bool | None = None,
) -> Explanation:
    """What `grouped_matmul` (or the call of `op`) would run for a Problem, or for arrays /
    jax.ShapeDtypeStructs lhs and rhs: the same decision, so it raises where the call would (a named
    backend that cannot run it, without `fallback=True`).

    Records nothing: a query is not a miss.
    """
    if isinstance(problem_or_lhs, Problem):
        problem = problem_or_lhs
    else:
        if rhs is None:
            raise ValueError("explain needs a Problem, or lhs and rhs (arrays or jax.ShapeDtypeStruct)")
        problem = problem_of(
            problem_or_lhs,
            rhs,
            group_sizes,
            transpose_rhs=transpose_rhs,
            preferred_element_type=preferred_element_type,
            op=op,
        )
    explanation, _ = _dispatch(
        problem, backend=backend, config=config, device=device or current_fingerprint(), fallback=fallback
    )
    return explanation


def _dispatch(
    problem: Problem,
    *,
    backend: str | None,
    config: KernelConfig | None,
    device: DeviceFingerprint,
    fallback: bool | None = None,
    sliced: bool = False,
) -> tuple[Explanation, KernelFn]:
    """`sliced`: the call serves a local slice of experts (group_offset), which a backend must take."""
    chain, reason, named = _backend_chain(backend, config, device)
    # A named backend answers alone unless the caller opts in to falling through; so does the default
    # one under fallback=False.
    strict = fallback is False or (named and fallback is not True)
    declined: list[Unsupported] = []
    for candidate in chain[:1] if strict else chain:
        try:
            kernel, resolution = _accept(problem, candidate, config, device, sliced)
        except Unsupported as e:
            if strict:
                raise Unsupported(_refusal(problem, candidate, reason, device, e)) from e
            declined.append(Unsupported(f"{candidate.name}: {e}"))
            continue
        if declined:
            # A backend the user asked for is worth a warning; the default declining is routine.
            LOOKUP.warn_once(
                "fallback",
                f"{device.hash}:{problem.key}:{candidate.name}",
                f"moetune: {problem.key} runs on {candidate.name}: " + "; ".join(map(str, declined)),
                level=logging.INFO if reason == DEFAULT_REASON else logging.WARNING,
            )
        explanation = Explanation(
            problem=problem,
            device=device,
            backend=candidate.name,
            backend_reason=reason,
            config=resolution.config,
            source=resolution.source,
            from_m=resolution.from_m,
            stale=resolution.stale,
            declined=tuple(map(str, declined)),
            median_s=resolution.median_s,
            heuristic_basis=candidate.heuristic_basis(device) if resolution.source == "heuristic" else None,
        )
        return explanation, kernel
    raise ExceptionGroup(f"no backend can compute {problem.key} on {device.device_kind}", declined)


def _accept(
    problem: Problem, backend: Backend, config: KernelConfig | None, device: DeviceFingerprint, sliced: bool
) -> tuple[KernelFn, Resolution]:
    """`backend`'s kernel for the call and where its config came from; Unsupported if it cannot run it."""
    unavailable = backend.available(device)
    if unavailable is not None:
        raise Unsupported(unavailable)
    if sliced and not backend.takes_group_offset(problem.op):
        raise Unsupported("takes no group_offset (a local slice of experts)")
    backend.check(problem)
    return _build(problem, backend, _resolve(problem, backend, config, device), device)


def _refusal(
    problem: Problem, backend: Backend, reason: str, device: DeviceFingerprint, error: Unsupported
) -> str:
    """One line: which backend was asked and why, what it cannot run, and how to let another run it."""
    escape = (
        f"unset {ENV_BACKEND} or pass fallback=True"
        if reason.startswith(ENV_BACKEND)
        else "pass fallback=True"
    )
    return (
        f"backend {backend.name} ({reason}) cannot run {problem.key} on {device.device_kind}: {error}; "
        f"{escape} to let the next backend run it"
    )


def _resolve(
    problem: Problem, backend: Backend, config: KernelConfig | None, device: DeviceFingerprint
) -> Resolution:
    if config is not None and type(config) is backend.config_class(problem.op):
        return Resolution(backend.name, config, "explicit config")
    return LOOKUP.resolve(problem, backend, device)


def _build(
    problem: Problem, backend: Backend, resolution: Resolution, device: DeviceFingerprint
) -> tuple[KernelFn, Resolution]:
    try:
        return backend.build(problem, resolution.config), resolution
    except ConfigInvalid as e:
        if resolution.source in ("explicit config", "heuristic"):
            raise
        # A stored winner the running kernel no longer accepts (its rules changed since tuning).
        LOOKUP.warn_once(
            "rejected-winner",
            f"{backend.name}:{problem.key}",
            f"moetune: {backend.name} rejects its {resolution.source} config for {problem.key} ({e}); "
            "using the heuristic",
        )
    heuristic = Resolution(backend.name, backend.heuristic(problem, device), "heuristic")
    return backend.build(problem, heuristic.config), heuristic


def _backend_chain(
    name: str | None, config: KernelConfig | None, device: DeviceFingerprint
) -> tuple[list[Backend], str, bool]:
    """The backends to ask, in order, why the first one leads, and whether it was named (argument,
    config or environment) rather than chosen by priority."""
    if name is not None:
        first, reason = registry.get(name), "backend argument"
        if config is not None and type(config) not in first.config_classes():
            raise ConfigInvalid(f"config {type(config).__qualname__} is not a config of backend {name!r}")
    elif config is not None:
        first, reason = _backend_of(config, device), f"backend of the {type(config).__qualname__} argument"
    elif os.environ.get(ENV_BACKEND):
        first, reason = registry.get(os.environ[ENV_BACKEND]), f"{ENV_BACKEND}={os.environ[ENV_BACKEND]}"
    else:
        roster = LOOKUP.backends(device)
        if not roster:
            raise UnknownBackend(f"no backend is available on {device.device_kind}")
        first, reason = roster[0], DEFAULT_REASON
    others = [b for b in LOOKUP.backends(device) if b.name not in (first.name, LAST_RESORT_BACKEND)]
    chain = [first, *others]
    if first.name != LAST_RESORT_BACKEND:
        chain.append(registry.get(LAST_RESORT_BACKEND))
    return chain, reason, reason != DEFAULT_REASON


def _backend_of(config: KernelConfig, device: DeviceFingerprint) -> Backend:
    for backend in LOOKUP.backends(device):
        if type(config) in backend.config_classes():
            return backend
    # The config may belong to a backend that is not available here; _dispatch then says so.
    for name in registry.names():
        try:
            backend = registry.get(name)
        except UnknownBackend:
            continue
        if type(config) in backend.config_classes():
            return backend
    raise ConfigInvalid(f"{type(config).__qualname__} is not the Config of any registered backend")
