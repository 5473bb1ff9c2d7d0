"""The fused MoE decode block (ops "moe_decode_block" and, on FP8 weights, "moe_decode_block_fp8") as the
mosaic_gpu backend serves it on Hopper: the two Pallas Triton kernels of kernels/moe/decode_block.py, tuned
by `DecodeBlockConfig`, or the path the block replaces.

`DecodeBlockConfig` is the block's own `DecodeConfig` (its tiling: every field there is one here, with its
default and its rules) and `fused`. `fused=False` is the unfused path `moe_mlp` takes without the block
(routing, the grouped GEMMs each dispatched with its own winner, the combine): the space's baseline
(space_decode.py), timed as a candidate of the op in every sweep, so that a winner with `fused=True` was
measured faster than it. Its other fields stay at their defaults.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any

from moetune.kernels.config import KernelConfig
from moetune.kernels.moe import decode_block

TILING = dataclasses.fields(decode_block.DecodeConfig)
_tiling_values = operator.attrgetter(*(f.name for f in TILING))


# Memoized: the space's constraints and the cost model ask each candidate for its tiling in turn, and
# the heuristic ranks tens of thousands of them (both classes are frozen: sharing one is safe).
@functools.lru_cache(maxsize=1024)
def _decode_config(self: Any) -> decode_block.DecodeConfig:
    """The block's tiling (DecodeConfig, which checks its own rules)."""
    return decode_block.DecodeConfig(*_tiling_values(self))


def _validate(self: Any) -> None:
    self.decode_config()


DecodeBlockConfig = dataclasses.make_dataclass(
    "DecodeBlockConfig",
    [("fused", bool, True), *((f.name, f.type, f.default) for f in TILING)],
    bases=(KernelConfig,),
    namespace={"decode_config": _decode_config, "validate": _validate, "__module__": __name__},
    frozen=True,
    slots=True,
)
DecodeBlockConfig.__doc__ = "fused (the block, or the unfused path it replaces) and the block's DecodeConfig."


def moe_decode_block(
    x: Any,
    router_logits: Any,
    w_gate_up: Any,
    w_down: Any,
    *,
    config: Any,
    transpose_rhs: bool,
    top_k: int,
    renormalize: bool = True,
    group_offset: Any = None,
    interpret: bool = False,
    w_gate_up_scale: Any = None,
    w_down_scale: Any = None,
    scale_layout: str = "none",
) -> Any:
    """out[T, H] of the block for `config`: the two kernels (in Pallas's interpreter with `interpret`), or
    with fused=False moe_mlp's unfused path, each on the weights' layout (`transpose_rhs`: K-major, which
    the unfused path's grouped GEMMs read as their t=1 problems). `renormalize` and `group_offset` as for
    moe_mlp; FP8 weights come with their scales in `scale_layout` (moe_decode_block_fp8)."""
    scales = dict(w_gate_up_scale=w_gate_up_scale, w_down_scale=w_down_scale)
    if not config.fused:
        from moetune.kernels.moe.layer import moe_mlp  # it dispatches through the backends

        return moe_mlp(
            x, router_logits, w_gate_up, w_down, top_k=top_k, renormalize=renormalize,
            group_offset=group_offset, transpose_weights=transpose_rhs, scale_layout=scale_layout,
            decode_mode="xla", **scales,
        )  # fmt: skip
    return decode_block.decode_block(
        x, router_logits, w_gate_up, w_down, top_k=top_k, renormalize=renormalize, group_offset=group_offset,
        config=config.decode_config(), transpose_weights=transpose_rhs, interpret=interpret, **scales,
    )  # fmt: skip


def moe_decode_block_fp8(
    x: Any,
    router_logits: Any,
    w_gate_up: Any,
    w_gate_up_scale: Any,
    w_down: Any,
    w_down_scale: Any,
    **options: Any,
) -> Any:
    """The block on FP8 weights (op "moe_decode_block_fp8", its operands in that op's order): the kernels
    widen each weight tile to x's dtype and scale its product; fused=False is moe_mlp's unfused FP8 path,
    which quantizes x and the hidden rows in the same layout. `options` as for moe_decode_block."""
    return moe_decode_block(
        x, router_logits, w_gate_up, w_down, w_gate_up_scale=w_gate_up_scale, w_down_scale=w_down_scale,
        **options,
    )  # fmt: skip
