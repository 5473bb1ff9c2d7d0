"""The static key of a kernel call: op, shapes, dtypes and layout flags.

Group sizes are runtime data and never part of the key: the same compiled kernel serves every routing,
so a sweep times candidates on representative routings and stores that distribution with the trial.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from moetune.kernels import ops
from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.ops import GROUPED_MATMUL, GROUPED_MATMUL_SWIGLU

if TYPE_CHECKING:
    from moetune.kernels.ops import OpSpec

DTYPES = ("bfloat16", "float16", "float32")
# Operand-only dtypes: FP8 operands come with float32 scales (`scale_layout`) and never make an output.
# Kept out of DTYPES, which config packs validate against, so a pack's schema is what it was. e4m3fnuz is
# the e4m3 flavour CDNA3 (gfx942) multiplies; CDNA4 and Hopper take OCP e4m3fn.
FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz")
OPERAND_DTYPES = DTYPES + FP8_DTYPES
# How the float32 scales of a quantized problem's operands cover them (moetune.kernels.ops.fp8_layout):
#   none                 no scales (every 16/32-bit problem)
#   tensor               one scale for lhs, one per expert for rhs
#   row_channel          one per lhs row (token), one per expert and output column of rhs
#   block_1x128_128x128  one per lhs row and 128 columns of K; one per expert and 128 x 128 block of rhs
SCALE_LAYOUTS = ("none", "tensor", "row_channel", "block_1x128_128x128")
# The op names most callers use, importable from here as from moetune.kernels.ops.
__all__ = [
    "DTYPES",
    "FP8_DTYPES",
    "GROUPED_MATMUL",
    "GROUPED_MATMUL_SWIGLU",
    "OPERAND_DTYPES",
    "SCALE_LAYOUTS",
    "Problem",
    "dtype_name",
    "problem_of",
]

_ALIASES = {
    "bf16": "bfloat16",
    "f16": "float16",
    "fp16": "float16",
    "f32": "float32",
    "fp32": "float32",
    "fp8": "float8_e4m3fn",
    "e4m3": "float8_e4m3fn",
    "e5m2": "float8_e5m2",
}


def dtype_name(dtype: Any, accepted: tuple[str, ...] = DTYPES) -> str:
    """Canonical name of a numpy/jax dtype or of a dtype string ('bf16' -> 'bfloat16'), one of `accepted`
    (OPERAND_DTYPES for an operand, which may be FP8)."""
    name = _ALIASES.get(dtype, dtype) if isinstance(dtype, str) else np.dtype(dtype).name
    if name not in accepted:
        raise ConfigInvalid(f"dtype={name!r} is not one of {', '.join(accepted)}")
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

    `scale_layout` (SCALE_LAYOUTS) says how the float32 scales of FP8 operands cover them; "none" for an
    op without scale operands, and an op with them needs another. `top_k` is the experts each token's
    router picks, for an op that routes its tokens itself (`OpSpec.routed`: the fused MoE decode block,
    whose m is T tokens, not T * top_k rows); 0 for every other op, and a routed op needs 1 <= top_k <= g.

    Key versions: v1 is every problem without scales or top_k, its key and dict exactly as before either
    existed (shipped packs and stored winners match them byte for byte); v2 adds ``,s=<layout>`` after
    ``t=`` and is written only for a scaled problem, e.g. ``grouped_matmul_fp8/m=4096,...,
    lhs=float8_e4m3fn,rhs=float8_e4m3fn,out=bfloat16,t=0,s=row_channel/v2``; v3 adds ``,top_k=<k>`` and
    is written only for a routed one, e.g. ``moe_decode_block/m=8,k=2048,n=1536,g=128,lhs=bfloat16,
    rhs=bfloat16,out=bfloat16,t=0,top_k=8/v3``.
    """

    SCHEMA_VERSION: ClassVar[int] = 1  # of problems without scales or top_k
    SCALED_SCHEMA_VERSION: ClassVar[int] = 2
    ROUTED_SCHEMA_VERSION: ClassVar[int] = 3

    op: str
    m: int
    k: int
    n: int
    g: int
    lhs_dtype: str = "bfloat16"
    rhs_dtype: str = "bfloat16"
    out_dtype: str = "bfloat16"
    transpose_rhs: bool = False
    scale_layout: str = "none"
    top_k: int = 0

    def __post_init__(self) -> None:
        for name in ("m", "k", "n", "g"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigInvalid(f"{name}={value!r} must be a positive integer")
        for name in ("lhs_dtype", "rhs_dtype"):
            object.__setattr__(self, name, dtype_name(getattr(self, name), OPERAND_DTYPES))
        object.__setattr__(self, "out_dtype", dtype_name(self.out_dtype))
        object.__setattr__(self, "transpose_rhs", bool(self.transpose_rhs))
        if self.scale_layout not in SCALE_LAYOUTS:
            layouts = ", ".join(SCALE_LAYOUTS)
            raise ConfigInvalid(f"scale_layout={self.scale_layout!r} is not one of {layouts}")
        spec = self.spec  # an unknown op lists the registered ones
        if bool(spec.scale_operands) != (self.scale_layout != "none"):
            wanted = f"one of {', '.join(SCALE_LAYOUTS[1:])}" if spec.scale_operands else "'none'"
            raise ConfigInvalid(f"op={self.op} takes scale_layout {wanted}, not {self.scale_layout!r}")
        top_k = self.top_k
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
            raise ConfigInvalid(f"top_k={top_k!r} must be a non-negative integer")
        if spec.routed and not 1 <= top_k <= self.g:
            raise ConfigInvalid(
                f"op={self.op} routes its tokens: it takes top_k in [1, g={self.g}], not {top_k}"
            )
        if not spec.routed and top_k:
            raise ConfigInvalid(f"op={self.op} takes no top_k (its rows come grouped); got top_k={top_k}")
        spec.check(self)

    @property
    def schema_version(self) -> int:
        """The key and dict version this problem is written with (see the class docstring)."""
        if self.top_k:
            return self.ROUTED_SCHEMA_VERSION
        return self.SCHEMA_VERSION if self.scale_layout == "none" else self.SCALED_SCHEMA_VERSION

    @property
    def spec(self) -> OpSpec:
        return ops.get(self.op)

    @property
    def shape_key(self) -> str:
        """The key without m: problems that share it differ only in token count (nearest-M lookup)."""
        scales = "" if self.scale_layout == "none" else f",s={self.scale_layout}"
        routed = f",top_k={self.top_k}" if self.top_k else ""
        return (
            f"{self.op}/k={self.k},n={self.n},g={self.g},lhs={self.lhs_dtype},rhs={self.rhs_dtype},"
            f"out={self.out_dtype},t={int(self.transpose_rhs)}{scales}{routed}/v{self.schema_version}"
        )

    @property
    def key(self) -> str:
        op, rest = self.shape_key.split("/", 1)
        return f"{op}/m={self.m},{rest}"

    @staticmethod
    def scale_layout_of_key(key: str) -> str:
        """The scale layout a key names: its ``s=`` field, "none" for a v1 key (which has none). Stores
        that keep a problem's fields in columns and its key beside them read the layout back from here."""
        fields = key.split("/")[1].split(",")
        return next((f[2:] for f in fields if f.startswith("s=")), "none")

    @staticmethod
    def top_k_of_key(key: str) -> int:
        """The top_k a key names: its ``top_k=`` field, 0 for a v1 or v2 key (which has none); read back
        as `scale_layout_of_key` is."""
        fields = key.split("/")[1].split(",")
        return next((int(f[6:]) for f in fields if f.startswith("top_k=")), 0)

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
        """The fields and the schema version; a dict holds scale_layout only for a scaled problem and top_k
        only for a routed one (a v1 dict is the v1 dict of old)."""
        data = {"schema_version": self.schema_version, **dataclasses.asdict(self)}
        if self.scale_layout == "none":
            del data["scale_layout"]
        if not self.top_k:
            del data["top_k"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Problem:
        data = dict(data)
        version = data.pop("schema_version", cls.SCHEMA_VERSION)
        versions = (cls.SCHEMA_VERSION, cls.SCALED_SCHEMA_VERSION, cls.ROUTED_SCHEMA_VERSION)
        if version not in versions:
            raise ConfigInvalid(
                f"problem schema_version={version} is not one of {', '.join(map(str, versions))}"
            )
        if version == cls.SCHEMA_VERSION and data.get("scale_layout", "none") != "none":
            raise ConfigInvalid(f"a schema_version={version} problem has no scale_layout")
        if (version == cls.ROUTED_SCHEMA_VERSION) != bool(data.get("top_k", 0)):
            raise ConfigInvalid(
                f"a schema_version={version} problem "
                + ("needs a top_k" if version == cls.ROUTED_SCHEMA_VERSION else "has no top_k")
            )
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
    scale_layout: str = "none",
) -> Problem:
    """The static key of a call of `op` on these operands (arrays or jax.ShapeDtypeStructs); raises
    ValueError naming the first shape that does not fit (ConfigInvalid, a ValueError, for the op's rules).
    The output dtype is `preferred_element_type`, else the operands' promoted dtype (bfloat16 for FP8
    operands, which no output takes)."""
    import jax.numpy as jnp

    m, k, n, g = ops.get(op).dims_of(lhs, rhs, group_sizes, transpose_rhs)
    if preferred_element_type is not None:
        out_dtype = preferred_element_type
    elif scale_layout != "none":
        out_dtype = jnp.bfloat16
    else:
        out_dtype = jnp.result_type(lhs.dtype, rhs.dtype)
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
        scale_layout=scale_layout,
    )
