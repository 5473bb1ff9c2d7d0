"""The static key of a kernel call: op, shapes, dtypes and layout flags.

Group sizes are runtime data and never part of the key: the same compiled kernel serves every routing,
so a sweep times candidates on representative routings and stores that distribution with the trial.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, ClassVar

from moetune.kernels.errors import ConfigInvalid

DTYPES = ("bfloat16", "float16", "float32")

GROUPED_MATMUL = "grouped_matmul"
# out[m, :n/2] = silu(lhs @ rhs[g][:, :n/2]) * (lhs @ rhs[g][:, n/2:]): the MoE gate_up GEMM with its
# SwiGLU activation applied to the float32 products (gate columns first, then up, as in moe_reference).
GROUPED_MATMUL_SWIGLU = "grouped_matmul_swiglu"
# Ops whose output has only half of rhs's N columns.
_HALF_N_OPS = frozenset({GROUPED_MATMUL_SWIGLU})


def known_ops() -> tuple[str, ...]:
    """The op names moetune computes: what a pack, a sweep file or --problem may name. Input checks ask
    this one function, never a list of their own."""
    return (GROUPED_MATMUL, GROUPED_MATMUL_SWIGLU)


def dtype_name(dtype: Any) -> str:
    """Canonical name of a numpy/jax dtype or of a dtype string ('bf16' -> 'bfloat16')."""
    aliases = {"bf16": "bfloat16", "f16": "float16", "fp16": "float16", "f32": "float32", "fp32": "float32"}
    if isinstance(dtype, str):
        name = aliases.get(dtype, dtype)
    else:
        import numpy as np

        name = np.dtype(dtype).name
    if name not in DTYPES:
        raise ConfigInvalid(f"dtype={name!r} is not one of {', '.join(DTYPES)}")
    return name


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class Problem:
    """One grouped GEMM: out[m, n] = lhs[m, k] @ rhs[g][k, n] with rows grouped contiguously by expert.

    `n` is always rhs's column count; the op may fuse an epilogue that changes the output's width, which
    `out_n` gives (out is [m, out_n]). `transpose_rhs` means the weights are stored [g, n, k]. Key strings
    look like
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
        if self.op in _HALF_N_OPS and self.n % 2:
            raise ConfigInvalid(f"op={self.op} needs an even n (gate and up halves); got n={self.n}")
        for name in ("lhs_dtype", "rhs_dtype", "out_dtype"):
            object.__setattr__(self, name, dtype_name(getattr(self, name)))
        object.__setattr__(self, "transpose_rhs", bool(self.transpose_rhs))

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
    def out_n(self) -> int:
        """Columns of the output: n, or n / 2 for an op that gates half of the columns by the other."""
        return self.n // 2 if self.op in _HALF_N_OPS else self.n

    @property
    def rhs_shape(self) -> tuple[int, int, int]:
        """The weights' shape: [g, n, k] when `transpose_rhs`, else [g, k, n]."""
        return (self.g, self.n, self.k) if self.transpose_rhs else (self.g, self.k, self.n)

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n

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
