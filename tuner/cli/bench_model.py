"""`moetune bench model`: prefill/decode throughput and MoE-layer time of a MoE model, per MoE path.

`bench_model_command` is a Typer command function not yet attached to any app: the `moetune bench`
group registers it, e.g. `bench_app.command("model")(bench_model_command)`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from moetune.kernels.errors import MoetuneError
from moetune.kernels.moe.pallas_mode import Mode
from moetune.models.config import MODELS
from moetune.models.kernel_choices import DEFAULT_CHOICES, HELP, KernelChoices, Residual
from moetune.tuner.cli.common import check_output_file, console, fail, json_text


def bench_model(
    model: str,
    batch: int,
    prompt: int,
    gen: int,
    paths: list[str],
    layers: int | None,
    out: Path | None,
    *,
    moe_tokens: tuple[int, ...] = (4096, 1),
    runs: int = 3,
    use_db: bool = True,
    choices: KernelChoices = DEFAULT_CHOICES,
    fp8: str = "none",
) -> dict[str, Any]:
    """Run the benchmark (moetune.models.bench), print its summary, and return the result."""
    # Before jax's GPU backend starts: its default 75% of memory leaves too little beside Mixtral-8x7B's
    # ~87 GiB of weights for the dense path's activations. An explicit setting wins.
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")
    from moetune.models.bench import run_model_bench, summary_lines

    result = run_model_bench(
        model,
        batch,
        prompt,
        gen,
        paths,
        layers,
        out,
        moe_tokens=moe_tokens,
        runs=runs,
        use_db=use_db,
        choices=choices,
        fp8=fp8,
        command="moetune bench model " + " ".join(_argv_tail()),
    )
    for line in summary_lines(result):
        console.print(line, markup=False, highlight=False)
    return result


def _argv_tail() -> list[str]:
    return sys.argv[sys.argv.index("model") + 1 :] if "model" in sys.argv else sys.argv[1:]


def _ints(text: str, option: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        fail(f"{option}={text!r} must be comma-separated integers")


def bench_model_command(
    model: Annotated[str, typer.Option(help=f"Model preset: {', '.join(MODELS)}.")] = "mixtral_8x7b",
    batch: Annotated[int, typer.Option(help="Sequences per step.")] = 1,
    prompt: Annotated[int, typer.Option(help="Prompt tokens per sequence (prefill).")] = 2048,
    gen: Annotated[int, typer.Option(help="Generated tokens per sequence (decode steps).")] = 128,
    paths: Annotated[str, typer.Option(help="MoE paths, comma-separated.")] = "dense,moetune,ragged",
    layers: Annotated[
        int | None, typer.Option(help="Run this many layers.", show_default="the preset's")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Write the JSON result here.", show_default="none")] = None,
    moe_tokens: Annotated[
        str, typer.Option(help="Token counts at which one MoE layer is timed alone (plus the model's).")
    ] = "4096,1",
    runs: Annotated[int, typer.Option(help="Timed runs per measurement, after one warm-up.")] = 3,
    no_db: Annotated[
        bool,
        typer.Option("--no-db", help="Look winners up in the shipped config packs only, not in a database."),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Also print the JSON result.")] = False,
    routing: Annotated[Mode, typer.Option(help=HELP["routing"])] = DEFAULT_CHOICES.routing,
    norm_router: Annotated[Mode, typer.Option(help=HELP["norm_router"])] = DEFAULT_CHOICES.norm_router,
    norm_route_gather: Annotated[
        Mode, typer.Option(help=HELP["norm_route_gather"])
    ] = DEFAULT_CHOICES.norm_route_gather,
    gemv: Annotated[Mode, typer.Option(help=HELP["gemv"])] = DEFAULT_CHOICES.gemv,
    decode_attention: Annotated[
        Mode, typer.Option(help=HELP["decode_attention"])
    ] = DEFAULT_CHOICES.decode_attention,
    decode_attention_tiling: Annotated[str, typer.Option(help=HELP["decode_attention_tiling"])] = str(
        DEFAULT_CHOICES.decode_attention_tiling
    ),
    decode_residual: Annotated[
        Residual, typer.Option(help=HELP["decode_residual"])
    ] = DEFAULT_CHOICES.decode_residual,
    fp8: Annotated[
        str,
        typer.Option(
            metavar="LAYOUT",
            help="Also run the model with FP8 experts, scales in LAYOUT (tensor, row_channel, "
            "block_1x128_128x128), on the moetune path; compared with the dense path.",
        ),
    ] = "none",
) -> None:
    """Prefill and decode tokens/s and the MoE time per layer for the dense, ragged and moetune paths.

    Each kernel choice is auto (the Pallas kernel on a GPU, XLA's ops elsewhere), kernel, xla, or
    interpret (the kernel in Pallas's interpreter)."""
    path_list = [p.strip() for p in paths.split(",") if p.strip()]
    tokens = _ints(moe_tokens, "--moe-tokens")
    if out is not None:
        check_output_file("--out", out)
    try:
        choices = KernelChoices.parse(
            routing=routing,
            norm_router=norm_router,
            norm_route_gather=norm_route_gather,
            gemv=gemv,
            decode_attention=decode_attention,
            decode_attention_tiling=decode_attention_tiling,
            decode_residual=decode_residual,
        )
        result = bench_model(
            model,
            batch,
            prompt,
            gen,
            path_list,
            layers,
            out,
            moe_tokens=tokens,
            runs=runs,
            use_db=not no_db,
            choices=choices,
            fp8=fp8,
        )
    except MoetuneError as e:
        fail(str(e))
    if as_json:
        typer.echo(json_text(result, indent=1, sort_keys=True))
    if not result["ok"]:
        raise typer.Exit(1)
