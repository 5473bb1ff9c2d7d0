"""The routed MoE MLP layer built on moetune's grouped GEMMs, and its dense reference.

layer.py           routing, sort by expert, gate_up (+ SwiGLU), down, combine: `moe_mlp`
fp8.py             `moe_mlp` on FP8 expert weights, activations quantized on the fly
reference.py       argument checks, gated activations, the dense all-experts reference
routing_kernel.py  decode-sized routing and sort in one Pallas Triton kernel
decode_block.py    the whole block at decode sizes in two Pallas Triton kernels (routing included)
"""

from typing import TYPE_CHECKING

from moetune.kernels import lazy_exports

if TYPE_CHECKING:  # the names as type checkers see them
    from moetune.kernels.moe.fp8 import moe_mlp_fp8, quantize_weights  # noqa: F401
    from moetune.kernels.moe.layer import (  # noqa: F401
        Routing,
        SortedRows,
        decode_choice,
        moe_mlp,
        moe_mlp_sorted,
        moe_mlp_using,
        moe_problems,
        permuted_rows,
        route,
        route_rows,
        serves,
        sort_by_expert,
    )
    from moetune.kernels.moe.reference import moe_mlp_reference  # noqa: F401

# Each public name -> the module it lives in. They load on first use, so that an op's spec importing
# reference.py's functions loads neither the layer nor its Pallas kernels.
_HOMES = {
    "moe_mlp_fp8": "fp8",
    "quantize_weights": "fp8",
    **dict.fromkeys(
        (
            "Routing",
            "SortedRows",
            "decode_choice",
            "moe_mlp",
            "moe_mlp_sorted",
            "moe_mlp_using",
            "moe_problems",
            "permuted_rows",
            "route",
            "route_rows",
            "serves",
            "sort_by_expert",
        ),
        "layer",
    ),
    "moe_mlp_reference": "reference",
}

__all__ = sorted(_HOMES)

__getattr__, __dir__ = lazy_exports.exports(__name__, _HOMES)
