"""`moetune bench tuner`: the tuner's own throughput on this machine or cluster. (Kernel and model
benchmarks against the peers live in the lab next door: lab/README.md.)"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from moetune.cli import app
from moetune.cli.common import JsonOption, check_output_file, check_range, console, fail, json_text
from moetune.kernels.errors import MoetuneError

bench_app = typer.Typer(help="Benchmarks: the tuner's throughput.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.command("tuner")
def bench_tuner(
    model: Annotated[
        str, typer.Option("--model", help="Model whose problems supply the candidates.")
    ] = "tiny",
    buckets: Annotated[
        str | None,
        typer.Option("--buckets", help="Token buckets T, e.g. 64,1024.", show_default="the model's"),
    ] = None,
    backend: Annotated[str, typer.Option("--backend", help="Backend (auto: the best available).")] = "auto",
    budget: Annotated[
        int | None,
        typer.Option("--budget", help="Candidates per problem.", show_default="the whole grid"),
    ] = None,
    workers: Annotated[
        int | None, typer.Option("--workers", help="Ray compile workers.", show_default="one per CPU")
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option("--ray-address", help="Join this Ray cluster.", show_default="start a local one"),
    ] = None,
    timeout_s: Annotated[float, typer.Option("--timeout-s", help="Per candidate and phase.")] = 300.0,
    routing: Annotated[str, typer.Option("--routing", help="As for `moetune tune`.")] = "balanced",
    sequential_budget: Annotated[
        int | None,
        typer.Option(
            "--sequential-budget",
            help="Candidates per problem of the one-by-one run, the first of the same grid.",
            show_default="--budget",
        ),
    ] = None,
    no_sequential: Annotated[
        bool, typer.Option("--no-sequential", help="Only the Ray run (e.g. to compare clusters).")
    ] = False,
    out: Annotated[
        Path | None, typer.Option("--out", help="Also write the result as JSON here.", show_default="none")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Variants per minute (compiled + verified + timed): a Ray sweep vs the same candidates in-process."""
    from moetune.kernels import registry
    from moetune.tuner.spec import SweepSpec
    from moetune.tuner.sweep_setup import model_problems
    from moetune.tuner.throughput import measure

    try:
        token_buckets = tuple(int(b) for b in buckets.split(",") if b.strip()) if buckets else ()
    except ValueError:
        fail(f"--buckets {buckets!r} is not a comma-separated list of token counts")
    check_range("--sequential-budget", sequential_budget)
    if out is not None:
        check_output_file("--out", out)
    try:
        spec = SweepSpec(
            backend=backend,
            models=(model,),
            token_buckets=token_buckets,
            budget=budget,
            workers=workers,
            ray_address=ray_address,
            timeout_s=timeout_s,
            routing=routing,
        )
        if backend != "auto":
            registry.get(backend)  # UnknownBackend names the registered ones, before Ray starts
        result = measure(
            spec, model_problems(spec), sequential_budget=sequential_budget, sequential=not no_sequential
        )
    except MoetuneError as e:
        fail(str(e))
    if out is not None:
        out.write_text(json_text(result.to_dict(), indent=1, sort_keys=True))
    if as_json:
        typer.echo(json_text(result.to_dict(), indent=1, sort_keys=True))
        return
    from rich.table import Table

    table = Table(
        title=f"tuner throughput: {result.backend} on {result.device_kind}, {result.problems} problems"
    )
    for column in (
        "mode",
        "workers",
        "variants",
        "seconds",
        "variants/min",
        "mean compile s",
        "start-up s",
        "statuses",
    ):
        table.add_column(column)
    for mode in (result.ray, result.sequential):
        compile_s = "-" if mode.mean_compile_s is None else f"{mode.mean_compile_s:.3g}"
        statuses = ", ".join(f"{k}={v}" for k, v in sorted(mode.statuses.items()))
        table.add_row(
            mode.mode,
            str(mode.workers),
            str(mode.variants),
            f"{mode.elapsed_s:.1f}",
            f"{mode.per_minute:.1f}",
            compile_s,
            f"{mode.startup_s:.1f}",
            statuses,
        )
    console.print(table)
    console.print(
        f"ray / sequential: {result.speedup:.2f}x variants per minute", markup=False, highlight=False
    )
    if out is not None:
        console.print(f"wrote {out}", markup=False, highlight=False)
