"""`moetune tune`: run a tuning sweep (or plan one with --dry-run, or finish one with --resume).

Exit codes: 0 the sweep is done; 2 bad input, or refused before anything ran (another process runs
that sweep, or another sweep times on the same device: --force); 3 incomplete (some problem could not be
decided, its finalists' re-timing failed twice: --resume re-times it); 4 the sweep stopped (the database
stopped accepting writes, or another process took the sweep over); 130 interrupted. The sweep itself runs
in tuner/sweep_run.py, the same code the queue's workers run a job with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from moetune.cli import app
from moetune.cli.common import DbOption, choice, err_console, fail, json_text
from moetune.kernels import registry
from moetune.kernels.errors import MoetuneError
from moetune.tuner import strategies
from moetune.tuner.spec import SweepSpec
from moetune.tuner.sweep_run import run_sweep, store_holding_sweeps

# Flags that may change when a sweep resumes: where it runs, not what it measures.
RESUMABLE = {"db", "ray_address", "workers", "minutes"}


def _buckets(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        buckets = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        fail(f"--buckets {text!r} is not a comma-separated list of token counts")
    if not buckets or min(buckets) < 1:
        fail(f"--buckets {text!r}: token counts are positive integers")
    return buckets


def _hf_models(path: Path | None, tp: int, ep: int) -> tuple[str, ...]:
    """--hf-config as the spec's model name (tuner/hf_config.py), read once here so that a bad file fails
    before anything is opened or written."""
    if path is None:
        if (tp, ep) != (1, 1):
            fail("--tp and --ep shard an --hf-config model; give one")
        return ()
    from moetune.tuner import hf_config

    try:
        hf_config.load_hf_config(path, tp=tp, ep=ep)
    except MoetuneError as e:
        fail(str(e))
    return (hf_config.reference(path, tp, ep),)


def _maxtext_target(params: dict[str, Any]) -> dict[str, Any] | None:
    """--maxtext-config, its overrides and options as the spec's `maxtext` mapping (checked here, so a bad
    one fails before anything is opened or written; the file is read when the spec is checked, before that
    too)."""
    path = params.get("maxtext_config")
    extras = {
        "arguments": params.get("overrides"),
        "--maxtext-devices": params.get("maxtext_devices"),
        "--maxtext-workloads": params.get("maxtext_workloads"),
    }
    if path is None:
        given = [name for name, value in extras.items() if value]
        if given:
            fail(f"{' and '.join(given)} go with --maxtext-config")
        return None
    target: dict[str, Any] = {"config": str(path.resolve()), "overrides": list(params.get("overrides") or ())}
    if params.get("maxtext_devices") is not None:
        target["devices"] = params["maxtext_devices"]
    if params.get("maxtext_workloads"):
        target["workloads"] = [w.strip() for w in params["maxtext_workloads"].split(",") if w.strip()]
    from moetune.integrations.maxtext.problems import Target

    try:
        return Target.from_dict(target, "--maxtext-config").to_dict()
    except MoetuneError as e:
        fail(str(e))


def _spec_default(name: str) -> str:
    """What --help shows for a flag that defaults to the sweep file's value, else SweepSpec's."""
    default = SweepSpec.__dataclass_fields__[name].default
    return f"the sweep file's, else {'none' if default is None else default}"


Strategy = choice("Strategy", strategies.names())


@app.command()
def tune(
    sweep: Annotated[
        str | None,
        typer.Option("--sweep", help="Sweep file (configs/sweeps/NAME or a path).", show_default="none"),
    ] = None,
    model: Annotated[
        list[str] | None,
        typer.Option(
            "--model", help="Model YAML (configs/models/NAME or a path); repeatable.", show_default="none"
        ),
    ] = None,
    problem: Annotated[
        list[str] | None,
        typer.Option(
            "--problem",
            help="One shape, by rows m: m=8192,k=4096,n=28672,g=8,dtype=bf16 (op=... for another op).",
            show_default="none",
        ),
    ] = None,
    hf_config: Annotated[
        Path | None,
        typer.Option(
            "--hf-config",
            help="A Hugging Face config.json: tune its MoE layer (one shard's).",
            show_default="none",
        ),
    ] = None,
    tp: Annotated[int, typer.Option("--tp", help="Tensor parallel: each expert's ffn split N ways.")] = 1,
    ep: Annotated[
        int,
        typer.Option("--ep", help="Expert parallel: experts split N ways; buckets count a shard's tokens."),
    ] = 1,
    buckets: Annotated[
        str | None,
        typer.Option("--buckets", help="Token buckets T, e.g. 1,16,256.", show_default="the model's"),
    ] = None,
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            help=f"auto (the best available) or a backend: {', '.join(registry.names())}.",
            show_default=_spec_default("backend"),
            autocompletion=lambda: ["auto", *registry.names()],
        ),
    ] = None,
    strategy: Annotated[
        Strategy | None,
        typer.Option("--strategy", help="Search strategy.", show_default=_spec_default("strategy")),
    ] = None,
    budget: Annotated[
        int | None,
        typer.Option("--budget", help="Trials per problem.", show_default="the sweep file's, else no limit"),
    ] = None,
    minutes: Annotated[
        float | None,
        typer.Option(
            "--minutes",
            help="Wall-clock budget of the whole sweep.",
            show_default="the sweep file's, else no limit",
        ),
    ] = None,
    routing: Annotated[
        str | None,
        typer.Option(
            "--routing",
            help="balanced, zipf:S or FILE.npy of expert ids [T, top_k]; several comma-separated "
            "(balanced,zipf:1.2): each candidate is timed on each, its time is their mean.",
            show_default=_spec_default("routing"),
            autocompletion=lambda: ["balanced", "zipf:1.2", "balanced,zipf:1.2"],
        ),
    ] = None,
    timeout_s: Annotated[
        float | None,
        typer.Option(
            "--timeout-s",
            help="Per candidate and phase (compile; verify+time).",
            show_default=_spec_default("timeout_s"),
        ),
    ] = None,
    runs: Annotated[
        int | None,
        typer.Option("--runs", help="Timed runs per candidate (>= 10).", show_default=_spec_default("runs")),
    ] = None,
    min_gain: Annotated[
        float | None,
        typer.Option(
            "--min-gain",
            help="Smallest gain that replaces a winner (0.02 = 2%).",
            show_default=_spec_default("min_gain"),
        ),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(
            "--seed", help="Seed of routing draws, inputs and strategies.", show_default=_spec_default("seed")
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option("--workers", help="Compile workers.", show_default="one per cluster CPU"),
    ] = None,
    db: DbOption = None,
    ray_address: Annotated[
        str | None,
        typer.Option("--ray-address", help="Join this Ray cluster.", show_default="start a local one"),
    ] = None,
    resume: Annotated[
        int | None,
        typer.Option("--resume", help="Finish sweep N: no finished trial is repeated.", show_default="none"),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan and an estimated time; run nothing.")
    ] = False,
    misses: Annotated[
        bool, typer.Option("--misses", help="Tune the shapes dispatch missed on this device.")
    ] = False,
    stale: Annotated[
        bool, typer.Option("--stale", help="Re-tune winners whose device or kernel source changed.")
    ] = False,
    compile_only: Annotated[
        bool, typer.Option("--compile-only", help="Compile for --arch without its device; time nothing.")
    ] = False,
    arch: Annotated[
        str | None,
        typer.Option(
            "--arch", help="Target of --compile-only, e.g. gfx942.", show_default="the backend's only one"
        ),
    ] = None,
    no_baseline: Annotated[
        bool, typer.Option("--no-baseline", help="Do not time XLA's ragged_dot for comparison.")
    ] = False,
    inline: Annotated[
        bool, typer.Option("--inline", help="No Ray: compile and time one by one in this process.")
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Time even while another sweep times on this device (both are disturbed)."
        ),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the outcome (or the plan) as JSON: numbers and objects.")
    ] = False,
    with_backward: Annotated[
        bool,
        typer.Option(
            "--with-backward",
            help="Also tune each problem's backward GEMMs (dlhs, drhs; a gated op's product), for training.",
        ),
    ] = False,
    decode_block: Annotated[
        bool,
        typer.Option(
            "--decode-block",
            help="Also tune the models' fused MoE decode block at their token buckets of up to 32 tokens "
            "(what moe_mlp looks up before it takes the block over the two GEMMs); with --fp8, the block "
            "on FP8 weights.",
        ),
    ] = False,
    maxtext_config: Annotated[
        Path | None,
        typer.Option(
            "--maxtext-config",
            help="A MaxText config YAML: tune the MoE GEMMs its model runs on one shard, traced from "
            "MaxText's own layer; key=value overrides follow as arguments, as MaxText takes them.",
            show_default="none",
        ),
    ] = None,
    maxtext_devices: Annotated[
        int | None,
        typer.Option(
            "--maxtext-devices",
            help="Devices of the MaxText mesh (axes at -1 fill them).",
            show_default="the product of the config's parallelisms",
        ),
    ] = None,
    maxtext_workloads: Annotated[
        str | None,
        typer.Option(
            "--maxtext-workloads",
            help="MaxText steps to tune: train (forward and backward), prefill, decode; comma-separated.",
            show_default="all three",
        ),
    ] = None,
    overrides: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="KEY=VALUE", help="MaxText overrides (with --maxtext-config).", show_default=False
        ),
    ] = None,
    fp8: Annotated[
        str | None,
        typer.Option(
            "--fp8",
            metavar="LAYOUT",
            help="The models' experts in FP8 with scales in LAYOUT (tensor, row_channel, "
            "block_1x128_128x128), K-major weights: the FP8 ops moe_mlp then dispatches.",
            show_default="none: the model's dtype",
        ),
    ] = None,
) -> None:
    """Tune kernels: compile candidates in parallel, verify each, time each exclusively, keep the winners.

    Exit codes: 0 done; 2 bad input or refused (the sweep runs elsewhere; the device is busy: --force);
    3 incomplete (re-timing failed twice: --resume); 4 stopped (the database failed, or the sweep was
    taken over); 130 interrupted."""
    flags = sweep_flags(locals())  # the first statement: locals() holds the parameters alone
    try:
        if resume is not None:
            changed = sorted(k for k, v in flags.items() if v not in (None, (), []) and k not in RESUMABLE)
            if changed or sweep:
                fail(f"--resume keeps the sweep's own settings; drop {', '.join(changed or ['--sweep'])}")
            if resume < 1:
                fail(f"--resume {resume}: sweep ids start at 1")
            with store_holding_sweeps(db, resume) as store:
                from moetune.tuner.sweep_setup import load_sweep

                spec, planned = load_sweep(store, resume)
            spec = spec.override(**{k: v for k, v in flags.items() if k in RESUMABLE})
            run_sweep(
                spec,
                planned,
                resume_id=resume,
                sweep_file=None,
                dry_run=dry_run,
                inline=inline,
                as_json=as_json,
                force=force,
            )
            return
        spec, sweep_file = checked_spec(sweep, flags)
        if not dry_run and not inline:  # a plan may be made for a larger cluster than this machine
            from moetune.tuner.sweep_setup import check_local_workers

            check_local_workers(spec)
        run_sweep(
            spec,
            None,
            resume_id=None,
            sweep_file=sweep_file,
            dry_run=dry_run,
            inline=inline,
            as_json=as_json,
            force=force,
        )
    except MoetuneError as e:
        from moetune.tuner.sweep_setup import NothingToTune

        if not isinstance(e, NothingToTune):
            fail(str(e))
        # --stale / --misses found nothing to do: not an error.
        err_console.print(str(e), markup=False, highlight=False)
        if as_json and not dry_run:
            typer.echo(json_text({"sweep_id": None, "nothing_to_tune": str(e), "problems": []}))


def sweep_flags(params: dict[str, Any]) -> dict[str, Any]:
    """The SweepSpec fields that tune's flags set, from the command's parameters by name (`moetune submit`
    takes the same ones); a flag left out is None or empty, and keeps the sweep file's value."""
    return dict(
        models=tuple(params["model"] or ()) + _hf_models(params["hf_config"], params["tp"], params["ep"]),
        problems=tuple(params["problem"] or ()),
        token_buckets=_buckets(params["buckets"]),
        backend=params["backend"],
        strategy=None if params["strategy"] is None else params["strategy"].value,
        budget=params["budget"],
        minutes=params["minutes"],
        routing=params["routing"],
        timeout_s=params["timeout_s"],
        runs=params["runs"],
        min_gain=params["min_gain"],
        seed=params["seed"],
        workers=params["workers"],
        db=params["db"],
        ray_address=params.get("ray_address"),
        misses=params["misses"] or None,
        stale=params["stale"] or None,
        with_backward=params["with_backward"] or None,
        decode_block=params["decode_block"] or None,
        fp8=params["fp8"],
        maxtext=_maxtext_target(params),
        baseline=False if params["no_baseline"] else None,
        compile_only=params["compile_only"] or None,
        arch=params["arch"],
    )


def checked_spec(sweep: str | None, flags: dict[str, Any]) -> tuple[SweepSpec, str | None]:
    """The sweep file's spec with `flags` over it, and where the file came from; checked as far as can be
    without the workers' device or the database (ConfigInvalid and friends)."""
    from moetune.tuner import sweep_setup
    from moetune.tuner.spec import load_sweep_file

    spec, sweep_file = load_sweep_file(sweep) if sweep else (SweepSpec(), None)
    spec = spec.override(**flags)
    sweep_setup.check_before_opening(spec)
    return spec, sweep_file
