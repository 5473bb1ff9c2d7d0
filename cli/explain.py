"""`moetune explain`: which backend and config a call of an op gets on this machine, and why."""

from __future__ import annotations

import contextlib
from typing import Annotated

import typer

from moetune.cli import app
from moetune.cli.common import (
    DB_HELP,
    JsonOption,
    check_range,
    checked_db,
    choice,
    fail,
    from_environment,
    json_text,
)
from moetune.db import urls
from moetune.kernels import ops, registry
from moetune.kernels.errors import MoetuneError
from moetune.kernels.problem import GROUPED_MATMUL

Op = choice("Op", ops.names())
# The dtype spellings moetune.kernels.problem.dtype_name reads.
Dtype = choice("Dtype", ("bf16", "f16", "f32", "bfloat16", "float16", "float32"))
DEFAULT_OP, DEFAULT_DTYPE = Op(GROUPED_MATMUL), Dtype("bf16")


@app.command()
def explain(
    ctx: typer.Context,
    m: Annotated[int, typer.Option("--m", help="Rows m of the call (T tokens x top_k for a MoE layer).")],
    k: Annotated[int, typer.Option("--k", help="Contraction size (K).")],
    n: Annotated[int, typer.Option("--n", help="Output columns (N; 2 x ffn for a fused gate_up op).")],
    g: Annotated[int, typer.Option("--g", help="Experts (G).")],
    op: Annotated[Op, typer.Option("--op", help="The op called.")] = DEFAULT_OP,
    dtype: Annotated[Dtype, typer.Option("--dtype", help="lhs and rhs dtype.")] = DEFAULT_DTYPE,
    out_dtype: Annotated[
        Dtype | None, typer.Option("--out-dtype", help="Output dtype.", show_default="--dtype")
    ] = None,
    transpose_rhs: Annotated[bool, typer.Option("--transpose-rhs", help="Weights stored [G, N, K].")] = False,
    top_k: Annotated[
        int | None,
        typer.Option(
            "--top-k",
            help="Experts per token, for an op that routes its tokens itself (moe_decode_block, the fused "
            "MoE decode block: --m is then T tokens, --k H, --n 2 x ffn, --g E).",
            show_default="none",
        ),
    ] = None,
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            help=f"Use this backend ({', '.join(registry.names())}); an error if it cannot run the shape "
            "(see --fallback).",
            show_default="the dispatch order",
            autocompletion=registry.names,
        ),
    ] = None,
    fallback: Annotated[
        bool,
        typer.Option("--fallback", help="Let the next backend take the shape when --backend cannot run it."),
    ] = False,
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            help=DB_HELP,
            envvar=urls.ENV_DB,
            show_envvar=True,
            show_default="the default file if it exists, else the config packs only",
            callback=checked_db,
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Say which backend and config `moetune.kernels.grouped_matmul` (or the call of --op) picks for a
    shape, and why."""
    from moetune.db import open_store
    from moetune.kernels import api
    from moetune.kernels.lookup import LOOKUP
    from moetune.kernels.problem import Problem

    for option, value in (("--m", m), ("--k", k), ("--n", n), ("--g", g)):
        check_range(option, value)
    if top_k is not None:
        check_range("--top-k", top_k)
    # $MOETUNE_DB is read as dispatch reads it (kernels.lookup); a --db given here must be there.
    explicit = None if from_environment(ctx, "db") else db
    try:
        if backend is not None:
            registry.get(backend)  # UnknownBackend names the registered ones, before any database opens
        problem = Problem(
            op=op.value,
            m=m,
            k=k,
            n=n,
            g=g,
            lhs_dtype=dtype.value,
            rhs_dtype=dtype.value,
            out_dtype=(out_dtype or dtype).value,
            transpose_rhs=transpose_rhs,
            top_k=top_k or 0,
        )
        if explicit:  # read as the lookup reads it, never created or migrated: a missing one is an error here
            open_store(explicit, read_only=True).close()
        with LOOKUP.using_db(explicit) if explicit else contextlib.nullcontext():
            explanation = api.explain(problem, backend=backend, fallback=True if fallback else None)
            block = _block_choice(problem, backend) if problem.spec.routed else None
    except MoetuneError as e:
        fail(str(e))
    except ExceptionGroup as group:
        fail(f"{group.message}: " + "; ".join(str(e) for e in group.exceptions))
    if as_json:
        data = explanation.to_dict() | {"op": problem.op, "tokens": None, "m": problem.m}
        if block is not None:
            data |= {"tokens": problem.m, "moe_mlp": {"path": _path(block), "reason": block.reason}}
        typer.echo(json_text(data, indent=1, sort_keys=True))
    else:
        p = problem
        if block is None:
            typer.echo(
                f"call:     {p.op}, m={p.m} rows (T unknown: m = T x top_k), k={p.k}, n={p.n}, g={p.g}"
            )
        else:
            typer.echo(f"call:     {p.op}, T={p.m} tokens x top_k={p.top_k}, H={p.k}, 2F={p.n}, E={p.g}")
        typer.echo(str(explanation))
        if block is not None:
            typer.echo(f"moe_mlp:  {_path(block)} ({block.reason})")


def _block_choice(problem, backend: str | None):
    """What moe_mlp (decode_mode 'auto') runs on this machine for the block's problem, and why."""
    import jax
    import jax.numpy as jnp

    from moetune.kernels.moe.layer import decode_choice

    x, logits, w_gate_up = (
        jax.ShapeDtypeStruct(s.shape, jnp.dtype(s.dtype)) for s in problem.spec.shape_dtypes(problem)[:3]
    )
    return decode_choice(x, logits, w_gate_up, problem.top_k, backend=backend)


def _path(choice) -> str:
    return "the fused block" if choice.config is not None else "the unfused path"
