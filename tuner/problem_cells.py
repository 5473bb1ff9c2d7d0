"""How a problem appears in the CLI's tables: its op, tokens T beside rows m, and the other dims.

m counts rows, T * top_k for a model's MoE layer (each token goes to top_k experts); T is known only
where a model planned the problem, and the sweep that tuned it recorded it. Elsewhere (a --problem given
by m, a config pack, a dispatch miss) a table shows m alone and its title says so.
"""

from __future__ import annotations

from typing import Any

from moetune.kernels.problem import Problem

UNKNOWN = "-"


def dtypes(problem: Problem) -> str:
    p = problem
    return ",".join(dict.fromkeys((p.lhs_dtype, p.rhs_dtype, p.out_dtype))) + (
        ",t" if p.transpose_rhs else ""
    )


def cells(problem: Problem, tokens: int | None, *, with_tokens: bool) -> dict[str, Any]:
    """op, T (when the table has the column), m, then k,n,g."""
    row: dict[str, Any] = {"op": problem.op}
    if with_tokens:
        row["T"] = UNKNOWN if tokens is None else tokens
    return row | {"m": problem.m, "k,n,g": f"{problem.k},{problem.n},{problem.g}"}


def tokens_note(tokens: list[int | None]) -> str:
    """What a title says about T: nothing when every row knows it."""
    if tokens and all(t is not None for t in tokens):
        return ""
    if not any(t is not None for t in tokens):
        return " (rows m only: T unknown)"
    return f" (T unknown where {UNKNOWN})"
