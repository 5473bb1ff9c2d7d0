"""What an op is: `OpSpec`, a frozen value holding everything the tuner, dispatch and the tests ask of
an op, so that none of them compares op names.

An op is a grouped GEMM over the generic dims of a Problem (m token rows, k, n, g experts, the dtypes,
transpose_rhs). Its spec gives, as functions of the Problem:
  * the operands in kernel call order (name, shape, dtype rule, how the tuner draws them), scale
    operands included (`Operand.scales` and `layout`: a quantized op's scale layout is part of its name,
    hence of every key);
  * the output shape, the dtypes it accepts and its own rules (`checks`);
  * its float32 reference (what every candidate is verified against) and tolerances by output dtype;
  * the input generator the tuner verifies and times on (`draw`);
  * FLOPs and bytes touched (scheduling, dry-run estimates, rooflines);
  * facts kernels and search spaces plan with: the gated `epilogue` applied to the float32 product and
    how many rhs columns make one output column;
  * `vjp`: the ops computing its cotangents (`Vjp`), each dispatched as its own Problem, so each is
    tuned and looked up apart from the forward; None for an op without a gradient;
  * `out_grouped`: the output is one slice per expert ([g, ...], the weight gradient) rather than one
    row per lhs row, so "rows past the groups are zero" reads "an expert with no rows is zero";
  * `routed`: the op routes its tokens itself from a router's logits (the fused MoE decode block,
    kernels/ops/moe_decode_block.py): its Problem carries `top_k`, which its reference and kernels take
    as a keyword (`options`), and its routing operand (kind "routing") is made from each routing draw.

The weight-gradient op (kernels/ops/grouped_matmul_drhs.py) and the FP8 ops (grouped_matmul_fp8.py,
scales in the layout the Problem names: `layout="by_problem"`) are built on these fields. The tuner
draws every operand but the group sizes and the scales by its `stddev`; a scale comes with the operand
it scales, from the spec's `draw` (values, scale). It verifies on a sample of the output: lhs rows for
a row-per-row output, K indices of every expert's slice for an `out_grouped` one
(tuner/input_cache.sample_axes).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import ml_dtypes  # noqa: F401 - numpy then knows bfloat16 and the float8 dtypes by name
import numpy as np

from moetune.kernels.deferred_jit import deferred_jit
from moetune.kernels.errors import ConfigInvalid

if TYPE_CHECKING:
    import jax

    from moetune.kernels.problem import Problem

# Relative error ||out - ref|| / ||ref|| a result may have, by output dtype: a few units of the dtype's
# rounding (bf16 keeps 8 mantissa bits, f16 11, f32 24), with room for a different summation order.
TOLERANCE: Mapping[str, float] = {"bfloat16": 1e-2, "float16": 1e-3, "float32": 1e-5}

# What an operand is to the tuner: "data" is drawn at random (never zeros), "group_sizes" is the routing
# (runtime data the tuner draws as routings, never part of a key), "scale" scales another operand,
# "routing" is made from a routing draw by the operand's `from_routing` (a router's logits that pick
# exactly the drawn experts: the routing of an op that routes its tokens itself).
OPERAND_KINDS = ("data", "group_sizes", "scale", "routing")
# How a scale operand covers the operand it scales; "by_problem": as the Problem's scale_layout says (the
# FP8 ops, one op for every layout: kernels/ops/fp8_scales.py).
SCALE_LAYOUTS = ("tensor", "row", "column", "block_1x128", "block_128x128", "by_problem")


@dataclasses.dataclass(frozen=True)
class Operand:
    """One argument of an op's kernels. `shape` and `dtype` are functions of the Problem; `stddev` is
    the spread of the normal draw the tuner feeds a data operand (None: not drawn)."""

    name: str
    shape: Callable[[Problem], tuple[int, ...]]
    dtype: Callable[[Problem], str]
    kind: str = "data"
    stddev: Callable[[Problem], float] | None = None
    scales: str = ""  # kind "scale": the operand it scales
    layout: str = ""  # kind "scale": one of SCALE_LAYOUTS
    # The layer's weights: fixed while the token count varies, so the problems that differ only in M
    # share one draw of them (the tuner's input cache; they are most of the bytes).
    weights: bool = False
    # kind "routing": (problem, group sizes of one routing draw, seed) -> the operand's values, one row
    # per lhs row (the tuner samples them with lhs's rows).
    from_routing: Callable[[Problem, Sequence[int], int], Any] | None = None

    def __post_init__(self) -> None:
        if self.kind not in OPERAND_KINDS:
            raise ConfigInvalid(f"operand {self.name}: kind={self.kind!r} is not one of {OPERAND_KINDS}")
        if (self.kind == "routing") != (self.from_routing is not None):
            raise ConfigInvalid(f"operand {self.name}: from_routing is set exactly for kind='routing'")
        if (self.kind == "scale") != bool(self.scales) or (self.kind == "scale") != bool(self.layout):
            raise ConfigInvalid(f"operand {self.name}: scales and layout are set exactly for kind='scale'")
        if self.layout and self.layout not in SCALE_LAYOUTS:
            raise ConfigInvalid(f"operand {self.name}: layout={self.layout!r} is not one of {SCALE_LAYOUTS}")


@dataclasses.dataclass(frozen=True)
class Vjp:
    """The ops of an op's cotangents, by name: `dlhs` is called as (dout, rhs, group_sizes) with the other
    rhs layout (dout @ rhs[g]^T), `drhs` as (lhs, dout, group_sizes) with the op's layout, giving a
    cotangent shaped like rhs. The group sizes get none (they are integers).

    `product`: for an op with a gated epilogue, the op that recomputes the float32 product the epilogue
    gates, so the forward keeps only its operands (a fused kernel never writes the product); the
    backward takes the epilogue's VJP on it, then dlhs and drhs of the product's cotangent."""

    dlhs: str
    drhs: str
    product: str = ""


ProblemCheck = Callable[["Problem"], "str | None"]


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One op; see the module docstring. `reference(*operands, transpose_rhs=...)` takes the operands in
    call order and returns the float32 output; `dims_of(lhs, rhs, group_sizes, transpose_rhs)` reads
    (m, k, n, g) off a call's operands (arrays or ShapeDtypeStructs), raising ValueError on a misfit."""

    name: str
    summary: str
    operands: tuple[Operand, ...]
    out_shape: Callable[[Problem], tuple[int, ...]]
    reference: Callable[..., jax.Array]
    dims_of: Callable[[Any, Any, Any, bool], tuple[int, int, int, int]]
    flops: Callable[[Problem], int]
    # The dtypes the op takes for lhs and rhs, and for its output; empty: every dtype a Problem holds.
    operand_dtypes: tuple[str, ...] = ()
    out_dtypes: tuple[str, ...] = ()
    checks: tuple[ProblemCheck, ...] = ()
    tolerance: Mapping[str, float] = dataclasses.field(default_factory=lambda: dict(TOLERANCE))
    epilogue: str = ""  # the gated activation applied to the float32 product ("" for none)
    rhs_columns_per_out_column: int = 1  # 2 under a gated epilogue: gate and up columns make one output
    out_columns: str = "N"  # what messages call the output's columns ("F" under a gated epilogue)
    vjp: Vjp | None = None
    out_grouped: bool = False
    routed: bool = False
    # What a kernel reads and writes when that is less than every operand (`bytes_touched`): the decode
    # block reads only its tokens' experts' weights. None: every operand and the output.
    touched_bytes: Callable[[Problem], int] | None = None

    def __post_init__(self) -> None:
        names = [o.name for o in self.operands]
        if len(set(names)) != len(names):
            raise ConfigInvalid(f"op {self.name}: operand names repeat: {names}")
        for operand in self.operands:
            if operand.kind == "scale" and operand.scales not in names:
                raise ConfigInvalid(f"op {self.name}: {operand.name} scales unknown operand {operand.scales}")
        if self.routed != any(o.kind == "routing" for o in self.operands):
            raise ConfigInvalid(f"op {self.name}: a routed op has a routing operand, and only a routed op")

    @property
    def linear_in_k(self) -> bool:
        """Whether partial products over slices of K may be summed afterwards (split-K): not under an
        epilogue, which is not linear in its input."""
        return not self.epilogue

    @property
    def scale_operands(self) -> tuple[Operand, ...]:
        return tuple(o for o in self.operands if o.kind == "scale")

    @property
    def drawn_operands(self) -> tuple[Operand, ...]:
        """The operands the tuner draws at random, in call order: all but the routing (group sizes, or a
        router's logits made from them) and the scales, which `draw` gives together with the operand they
        scale (values, scale)."""
        return tuple(o for o in self.operands if o.kind not in ("group_sizes", "scale", "routing"))

    def options(self, problem: Problem) -> dict[str, Any]:
        """The Problem's fields the reference and the kernels take as keywords: the weights' layout, and a
        routed op's top_k."""
        routed = {"top_k": problem.top_k} if self.routed else {}
        return {"transpose_rhs": problem.transpose_rhs, **routed}

    def routing_rows(self, problem: Problem) -> int:
        """The rows a routing draw spreads over the g experts: m, or for a routed op its m tokens' top_k
        choices each."""
        return problem.m * problem.top_k if self.routed else problem.m

    def expert_capacity(self, problem: Problem) -> int | None:
        """The most rows one expert may take in a routing draw: a router picks each token's top_k experts
        apart, so at most m for a routed op (which also routes every token: no row is left out); None for
        grouped rows, which any expert may take all of."""
        return problem.m if self.routed else None

    def operand(self, name: str) -> Operand:
        for operand in self.operands:
            if operand.name == name:
                return operand
        raise ConfigInvalid(
            f"op {self.name} has no operand {name!r}; it has {[o.name for o in self.operands]}"
        )

    def check(self, problem: Problem) -> None:
        """Raise ConfigInvalid naming the first rule of this op that `problem` breaks."""
        for role, dtype, accepted in (
            ("lhs", problem.lhs_dtype, self.operand_dtypes),
            ("rhs", problem.rhs_dtype, self.operand_dtypes),
            ("out", problem.out_dtype, self.out_dtypes),
        ):
            if accepted and dtype not in accepted:
                raise ConfigInvalid(f"op={self.name} takes {role} dtypes {', '.join(accepted)}, not {dtype}")
        for check in self.checks:
            reason = check(problem)
            if reason is not None:
                raise ConfigInvalid(f"op={self.name} {reason}")

    def tolerance_for(self, out_dtype: str) -> float:
        return self.tolerance[out_dtype]

    def shape_dtypes(self, problem: Problem) -> tuple[jax.ShapeDtypeStruct, ...]:
        """The argument shapes a kernel of `problem` is compiled for, in call order."""
        import jax

        return tuple(
            jax.ShapeDtypeStruct(o.shape(problem), np.dtype(o.dtype(problem))) for o in self.operands
        )

    def bytes_touched(self, problem: Problem) -> int:
        """Bytes of every operand (all experts' weights) and of the output: what a kernel reads and writes
        at most, the memory side of a roofline; `touched_bytes` where the op says less."""
        if self.touched_bytes is not None:
            return self.touched_bytes(problem)

        def nbytes(shape: tuple[int, ...], dtype: str) -> int:
            return math.prod(shape) * np.dtype(dtype).itemsize

        total = sum(nbytes(o.shape(problem), o.dtype(problem)) for o in self.operands)
        return total + nbytes(self.out_shape(problem), problem.out_dtype)

    def draw(self, problem: Problem, name: str, key: Any) -> jax.Array:
        """Random values for operand `name` from `key`: what the tuner verifies and times on (never zeros).
        Generated on the device: host-side numpy would take seconds for the largest weights."""
        operand = self.operand(name)
        if operand.stddev is None:
            raise ConfigInvalid(f"op {self.name}: operand {name} is not drawn at random ({operand.kind})")
        return _normal(key, operand.shape(problem), operand.dtype(problem), float(operand.stddev(problem)))


@deferred_jit(static_argnames=("shape", "dtype", "stddev"))
def _normal(key: jax.Array, shape: tuple[int, ...], dtype: str, stddev: float) -> jax.Array:
    import jax

    return (jax.random.normal(key, shape, np.float32) * stddev).astype(dtype)
