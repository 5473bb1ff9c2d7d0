"""moetune.kernels: tuned MoE grouped GEMM for JAX, looked up per device at trace time.

    from moetune.kernels import grouped_matmul
    out = grouped_matmul(lhs, rhs, group_sizes)   # lhs [M, K], rhs [G, K, N], group_sizes [G] int32

Every op of moetune.kernels.ops is reachable as call_op(name, lhs, rhs, group_sizes).

The public names load on first use (PEP 562): importing a module of this package that needs no kernel,
as the CLI, the database layer and the service do (`moetune.kernels.errors`, say), then loads no more
than that module needs, not the kernels' Pallas lowerings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from moetune.kernels import lazy_exports

if TYPE_CHECKING:  # the names as type checkers see them
    from moetune.kernels.api import (  # noqa: F401
        Explanation,
        call_op,
        call_scaled_op,
        explain,
        grouped_matmul,
        grouped_matmul_fp8,
        grouped_matmul_swiglu,
        grouped_matmul_swiglu_fp8,
        problem_of,
        recording,
    )
    from moetune.kernels.lookup import LOOKUP, Resolution, Winner  # noqa: F401
    from moetune.kernels.moe import moe_mlp  # noqa: F401
    from moetune.kernels.moe.reference import moe_mlp_reference  # noqa: F401

# Each public name -> the module it lives in.
_HOMES = {
    **dict.fromkeys(
        (
            "Explanation",
            "call_op",
            "call_scaled_op",
            "explain",
            "grouped_matmul",
            "grouped_matmul_fp8",
            "grouped_matmul_swiglu",
            "grouped_matmul_swiglu_fp8",
            "problem_of",
            "recording",
        ),
        "api",
    ),
    **dict.fromkeys(("LOOKUP", "Resolution", "Winner"), "lookup"),
    "moe_mlp": "moe",
    "moe_mlp_reference": "moe.reference",
}

__all__ = sorted(_HOMES)


__getattr__, __dir__ = lazy_exports.exports(__name__, _HOMES)
