"""The static key of a kernel call: op, shapes, dtypes and layout flags.

Group sizes are runtime data and never part of the key: the same compiled kernel serves every routing,
so a sweep times candidates on representative routings and stores that distribution with the trial.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any, ClassVar

import jax.numpy as jnp
import numpy as np

from moetune.kernels import ops
from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.ops import GROUPED_MATMUL, GROUPED_MATMUL_SWIGLU

if TYPE_CHECKING:
    from moetune.kernels.ops import OpSpec

DTYPES = ("bfloat16", "float16", "float32")
# The op names most callers use, importable from here as from moetune.kernels.ops.
__all__ = ["DTYPES", "GROUPED_MATMUL", "GROUPED_MATMUL_SWIGLU", "Problem", "dtype_name", "problem_of"]


def dtype_name(dtype: Any) -> str:
    """Canonical name of a numpy/jax dtype or of a dtype string ('bf16' -> 'bfloat16')."""
    aliases = {"bf16": "bfloat16", "f16": "float16", "fp16": "float16", "f32": "float32", "fp32": "float32"}
    if isinstance(dtype, str):
        name = aliases.get(dtype, dtype)
    else:
        name = np.dtype(dtype).name
    if name not in DTYPES:
        raise ConfigInvalid(f"dtype={name!r} is not one of {', '.join(DTYPES)}")
    return name


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class Problem:
    """One call of an op over the generic dims of a grouped GEMM: m token rows grouped contiguously by
    expert, k, n (rhs's columns), g experts, the dtypes and the weights' layout.

    What the op makes of them (operands, output shape, its own rules, FLOPs) is the op's spec
    (`spec`, moetune.kernels.ops): for "grouped_matmul" out[m, n] = lhs[m, k] @ rhs[g][k, n]; an op fusing
    an epilogue may change the output's width, which `out_n` gives. `transpose_rhs` means the weights are
    stored [g, n, k]. Key strings look like
    ``grouped_matmul/m=4096,k=4096,n=28672,g=8,lhs=bfloat16,rhs=bfloat16,out=bfloat16,t=0/v1``.
    """

    SCHEMA_VERSION: ClassVar[int] = 1

    op: str
    m: int
    k: int
    n: int
    g: int
    lhs_dtype: str = "bfloat16"
    rhs_dtype: str = "bfloat16"
    out_dtype: str = "bfloat16"
    transpose_rhs: bool = False

    def __post_init__(self) -> None:
        for name in ("m", "k", "n", "g"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigInvalid(f"{name}={value!r} must be a positive integer")
        for name in ("lhs_dtype", "rhs_dtype", "out_dtype"):
            object.__setattr__(self, name, dtype_name(getattr(self, name)))
        object.__setattr__(self, "transpose_rhs", bool(self.transpose_rhs))
        self.spec.check(self)  # an unknown op lists the registered ones

    @property
    def spec(self) -> OpSpec:
        return ops.get(self.op)

    @property
    def shape_key(self) -> str:
        """The key without m: problems that share it differ only in token count (nearest-M lookup)."""
        return (
            f"{self.op}/k={self.k},n={self.n},g={self.g},lhs={self.lhs_dtype},rhs={self.rhs_dtype},"
            f"out={self.out_dtype},t={int(self.transpose_rhs)}/v{self.SCHEMA_VERSION}"
        )

    @property
    def key(self) -> str:
        op, rest = self.shape_key.split("/", 1)
        return f"{op}/m={self.m},{rest}"

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.spec.out_shape(self)

    @property
    def out_n(self) -> int:
        """Columns of the output: n, or n / 2 for an op that gates half of the columns by the other."""
        return self.out_shape[-1]

    @property
    def rhs_shape(self) -> tuple[int, int, int]:
        """The weights' shape: [g, n, k] when `transpose_rhs`, else [g, k, n]."""
        return (self.g, self.n, self.k) if self.transpose_rhs else (self.g, self.k, self.n)

    @property
    def flops(self) -> int:
        return self.spec.flops(self)

    @property
    def bytes_touched(self) -> int:
        """Bytes of every operand and of the output (moetune.kernels.ops.OpSpec.bytes_touched)."""
        return self.spec.bytes_touched(self)

    def with_m(self, m: int) -> Problem:
        return dataclasses.replace(self, m=m)

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.SCHEMA_VERSION, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Problem:
        data = dict(data)
        version = data.pop("schema_version", cls.SCHEMA_VERSION)
        if version != cls.SCHEMA_VERSION:
            raise ConfigInvalid(f"problem schema_version={version} is not {cls.SCHEMA_VERSION}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigInvalid(f"unknown problem fields: {', '.join(unknown)}")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Problem:
        return cls.from_dict(json.loads(text))


def problem_of(
    lhs: Any,
    rhs: Any,
    group_sizes: Any = None,
    *,
    transpose_rhs: bool = False,
    preferred_element_type: Any = None,
    op: str = GROUPED_MATMUL,
) -> Problem:
    """The static key of a call of `op` on these operands (arrays or jax.ShapeDtypeStructs); raises
    ValueError naming the first shape that does not fit (ConfigInvalid, a ValueError, for the op's rules).
    The output dtype is `preferred_element_type`, else the operands' promoted dtype."""
    m, k, n, g = ops.get(op).dims_of(lhs, rhs, group_sizes, transpose_rhs)
    out_dtype = (
        jnp.result_type(lhs.dtype, rhs.dtype) if preferred_element_type is None else preferred_element_type
    )
    return Problem(
        op=op,
        m=m,
        k=k,
        n=n,
        g=g,
        lhs_dtype=np.dtype(lhs.dtype).name,
        rhs_dtype=np.dtype(rhs.dtype).name,
        out_dtype=np.dtype(out_dtype).name,
        transpose_rhs=transpose_rhs,
    )
