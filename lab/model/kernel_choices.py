"""Which kernel runs each of the benchmark model's small operations: one frozen, hashable value that
the model benchmark's command line builds from its flags and the model's jitted functions take as a
static argument.

Each mode field is one of moetune.kernels.moe.pallas_mode.MODES: "auto" (the default: the Pallas kernel
on a GPU, XLA's ops elsewhere), "kernel", "xla" or "interpret" (the kernel in Pallas's interpreter, on
any backend). A kernel that does not fit a shape (too many rows, experts or columns) leaves it to XLA
whatever its field says.

`decode_block` is moe_mlp's own `decode_mode`, passed through as given on the moetune path: moe_mlp
decides per shape whether its fused decode block runs (moetune.kernels.moe.layer.decode_choice), and
its "auto" is moe_mlp's (today: the unfused path), not "the kernel on a GPU".
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, get_args

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.moe import pallas_mode
from moetune.kernels.moe.pallas_mode import Mode
from moetune_lab.model.decode_attention import Tiling as AttentionTiling

Residual = Literal["accumulate", "add"]
RESIDUALS: tuple[str, ...] = get_args(Residual)

# What each field switches, for the CLI's and the benchmark script's help (one text for both).
HELP: dict[str, str] = {
    "routing": "The MoE layer's top-k and sort by expert.",
    "norm_router": "The MoE block's RMSNorm and router logits.",
    "norm_route_gather": "The moetune path's norm, router, routing and row gather as one kernel.",
    "gemv": "A decode step's attention RMSNorm + wqkv, and its wo.",
    "decode_attention": "A decode step's attention and cache write.",
    "decode_attention_tiling": "The decode attention kernel's tiling.",
    "decode_residual": "accumulate: a float32 decode residual that wo's GEMV adds into; add: two adds.",
    "decode_block": "The moetune path's MoE MLP as moe_mlp's fused decode block (its decode_mode, passed as "
    "given: auto leaves it to moe_mlp, xla never, kernel on a Hopper GPU, interpret in Pallas's "
    "interpreter), where the block fits the shape (up to 32 tokens, 16-bit experts).",
}


MODE_FIELDS = ("routing", "norm_router", "norm_route_gather", "gemv", "decode_attention")
# Modes passed to moetune as they are: moetune resolves them per shape, so "auto" stays "auto" here.
PASSED_MODE_FIELDS = ("decode_block",)


@dataclasses.dataclass(frozen=True, slots=True)
class KernelChoices:
    """The mode of each kernel (MODE_FIELDS), the decode attention kernel's tiling, how a decode step adds
    its residuals, and moe_mlp's decode_mode (PASSED_MODE_FIELDS); checked at construction (ConfigInvalid
    names the field and the choices)."""

    routing: Mode = "auto"
    norm_router: Mode = "auto"
    norm_route_gather: Mode = "auto"
    gemv: Mode = "auto"
    decode_attention: Mode = "auto"
    decode_attention_tiling: AttentionTiling = AttentionTiling()
    decode_residual: Residual = "accumulate"
    decode_block: Mode = "auto"

    def __post_init__(self) -> None:
        for name in (*MODE_FIELDS, *PASSED_MODE_FIELDS):
            pallas_mode.check(getattr(self, name), name)
        if not isinstance(self.decode_attention_tiling, AttentionTiling):
            raise ConfigInvalid(f"decode_attention_tiling={self.decode_attention_tiling!r} is not a Tiling")
        if self.decode_residual not in RESIDUALS:
            raise ConfigInvalid(
                f"decode_residual={self.decode_residual!r}; expected one of {', '.join(RESIDUALS)}"
            )

    @classmethod
    def parse(cls, **text: str) -> KernelChoices:
        """Choices from flag text: each mode and decode_residual as given, the tiling as 'block_k=64,...'.
        Fields left out keep their defaults; an unknown one raises ConfigInvalid naming the known."""
        known = [field.name for field in dataclasses.fields(cls)]
        unknown = sorted(set(text) - set(known))
        if unknown:
            raise ConfigInvalid(f"unknown kernel choices {', '.join(unknown)}; known: {', '.join(known)}")
        values: dict[str, Any] = dict(text)
        if "decode_attention_tiling" in values:
            values["decode_attention_tiling"] = AttentionTiling.parse(values["decode_attention_tiling"])
        return cls(**values)

    def resolved(self) -> dict[str, str]:
        """What runs on this backend, as text: each mode with "auto" resolved, the tiling, the residual, and
        the modes moetune resolves itself as given."""
        modes = {name: pallas_mode.resolve(getattr(self, name), name) for name in MODE_FIELDS}
        return modes | {
            "decode_attention_tiling": str(self.decode_attention_tiling),
            "decode_residual": self.decode_residual,
            **{name: getattr(self, name) for name in PASSED_MODE_FIELDS},
        }

    def mode(self, name: str) -> str:
        """Field `name`'s mode resolved for jax's default backend: "kernel", "xla" or "interpret" (a field
        of MODE_FIELDS: the PASSED_MODE_FIELDS go to moetune as they are)."""
        if name not in MODE_FIELDS:
            raise ValueError(f"{name} is not one of the modes resolved here: {', '.join(MODE_FIELDS)}")
        return pallas_mode.resolve(getattr(self, name), name)


DEFAULT_CHOICES = KernelChoices()  # every kernel "auto"
