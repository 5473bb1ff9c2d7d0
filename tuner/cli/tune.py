"""`moetune tune`: run a tuning sweep (or plan one with --dry-run, or finish one with --resume).

Exit codes: 0 the sweep is done; 2 bad input, or refused before anything ran (another process runs
that sweep, or another sweep times on the same device: --force); 3 incomplete (some problem could not be
decided, its finalists' re-timing failed twice: --resume re-times it); 4 the sweep stopped (the database
stopped accepting writes, or another process took the sweep over); 130 interrupted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from moetune.kernels import registry
from moetune.kernels.errors import MoetuneError
from moetune.tuner import strategies
from moetune.tuner.cli import app, problem_cells
from moetune.tuner.cli.common import DbOption, cell, choice, err_console, fail, json_text, table_console
from moetune.tuner.spec import SweepSpec

# Flags that may change when a sweep resumes: where it runs, not what it measures.
RESUMABLE = {"db", "ray_address", "workers", "minutes"}
EXIT_INCOMPLETE = 3
EXIT_STOPPED = 4


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
            with _store_holding_sweeps(db, resume) as store:
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


def _stop(message: str, code: int) -> NoReturn:
    """One line on stderr, and the exit code of a sweep that did not end done."""
    err_console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@dataclasses.dataclass
class _Lease:
    started: bool  # the sweep claimed its device and runs: from here on the driver finishes it


@contextlib.contextmanager
def _leased(store, resume_id: int | None, owner) -> Iterator[_Lease]:
    """For --resume: the sweep's lease, taken before any worker starts (a second resumer is refused at
    once) and let go again when the run ends before the sweep started."""
    lease = _Lease(started=resume_id is None)
    if resume_id is not None:
        store.acquire_sweep(resume_id, owner)
    try:
        yield lease
    finally:
        if not lease.started:
            with contextlib.suppress(MoetuneError):  # the database may be what failed
                store.release_sweep(resume_id, owner)


def _store_holding_sweeps(db: str | None, sweep_id: int):
    """The store to resume a sweep from; a database that does not exist yet, or holds no tables, is
    refused without being created or migrated."""
    from moetune.db import open_store
    from moetune.db.errors import RecordNotFound
    from moetune.db.store import schema_state_of

    state = schema_state_of(db)
    if not state.holds_tables:
        raise RecordNotFound(f"no sweep with id {sweep_id}: database {state.url} holds no sweeps")
    return open_store(db)


def run_sweep(
    spec,
    planned,
    *,
    resume_id,
    sweep_file,
    dry_run: bool,
    inline: bool,
    as_json: bool,
    force: bool,
    on_sweep: Callable[[int], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Run (or plan) the sweep as `tune` does, with its output and exit codes; `on_sweep(id)` is told the
    sweep's id once it is leased and running (`moetune worker` records it in its job); once `stop` is
    set, the candidates in flight are finished and the sweep ends interrupted (SweepDriver)."""
    from moetune.db import open_store
    from moetune.db.leases import Owner

    store = _plan_store(spec.db) if dry_run else open_store(spec.db)
    owner = Owner.here()
    try:
        if dry_run:
            _dry_run(spec, planned, store, as_json)
            return
        with _leased(store, resume_id, owner) as lease:
            outcome = _sweep(
                spec, planned, store, owner, lease, resume_id, sweep_file, inline, force, on_sweep, stop
            )
        _print_outcome(outcome, as_json)
        if outcome.incomplete:
            _stop(
                f"sweep {outcome.sweep_id} is incomplete: re-timing failed twice for "
                f"{', '.join(outcome.incomplete)} (no new winner); finish it with: "
                f"moetune tune --resume {outcome.sweep_id}",
                EXIT_INCOMPLETE,
            )
    finally:
        store.close()


def _plan_store(db: str | None):
    """What a plan (--dry-run) reads, which it never writes: the database read-only where it exists,
    else an empty one in memory (a plan of a database not created yet creates none)."""
    from moetune.db import open_store
    from moetune.db.store import schema_state_of

    if not schema_state_of(db).holds_tables:
        return open_store("sqlite://")
    return open_store(db, read_only=True)


def _sweep(
    spec, planned, store, owner, lease, resume_id, sweep_file, inline: bool, force: bool, on_sweep, stop
):
    from moetune.db.errors import DatabaseError, LeaseLost
    from moetune.tuner import sweep_setup
    from moetune.tuner.driver import SweepDriver
    from moetune.tuner.progress import default_progress, setup_snapshot

    # The set-up (cluster, workers importing JAX and opening their devices) is shown as it happens; the
    # sweep's display takes over from it.
    progress, began = default_progress(), time.monotonic()
    progress.start(setup_snapshot("starting the Ray cluster" if not inline else "starting", 0.0))

    def starting(activity) -> None:
        progress.update(setup_snapshot("starting workers", time.monotonic() - began, activity))

    try:
        executor, started_ray = sweep_setup.make_executor(spec, inline=inline, on_starting=starting)
    except BaseException:
        progress.abandon()
        raise
    ran = False
    try:
        backend, device, target = sweep_setup.resolve_target(spec, executor.device)
        if planned is None:
            planned = sweep_setup.resolve_problems(spec, store, backend, device)
        sweep_setup.check_space(spec, backend, planned, device)
        # The device is known now that the workers run; a timing sweep claims it before any trial.
        if resume_id is None:
            sweep_id = sweep_setup.create_sweep(
                store, spec, backend, planned, device, sweep_file, owner=owner, force=force
            )
        else:
            sweep_id = resume_id
            store.claim_device(sweep_id, owner, None if target else device, force=force)
        lease.started = True
        if on_sweep is not None:
            on_sweep(sweep_id)
        err_console.print(
            f"sweep {sweep_id}: {len(planned)} problems, backend {backend.name}, "
            f"strategy {spec.strategy}, {executor.workers} workers on {device.device_kind}; "
            f"database {store.url}",
            markup=False,
            highlight=False,
        )
        driver = SweepDriver(
            store,
            executor,
            spec,
            backend=backend.name,
            progress=progress,
            compile_target=target,
            device=device,
            owner=owner,
            stop=stop,
        )
        ran = True  # the driver closes the display
        try:
            return driver.run(planned, sweep_id=sweep_id)
        except KeyboardInterrupt:
            err_console.print(f"interrupted; finish it with: moetune tune --resume {sweep_id}", markup=False)
            raise typer.Exit(130) from None
        except LeaseLost as e:
            _stop(str(e), EXIT_STOPPED)
        except DatabaseError as e:
            _stop(
                f"sweep {sweep_id} failed: {e}; the trials recorded before are kept (finish it with: "
                f"moetune tune --resume {sweep_id})",
                EXIT_STOPPED,
            )
    finally:
        if not ran:
            progress.abandon()
        executor.close()
        if started_ray:
            from moetune.tuner import ray_pool

            ray_pool.disconnect()


def _dry_run(spec, planned, store, as_json: bool) -> None:
    from moetune.kernels.device import current_fingerprint
    from moetune.tuner import sweep_setup
    from moetune.tuner.dry_run import make_plan

    # No cluster is started for a plan: this machine's device stands in for the workers'.
    backend, device, _ = sweep_setup.resolve_target(spec, current_fingerprint())
    if planned is None:
        planned = sweep_setup.resolve_problems(spec, store, backend, device)
    workers = spec.workers or len(os.sched_getaffinity(0))
    plan = make_plan(spec, planned, store, backend.name, device, workers=workers)
    if as_json:
        rows = [vars(r) for r in plan.rows]
        typer.echo(
            json_text(
                {
                    "backend": backend.name,
                    "device": device.device_kind,
                    "problems": rows,
                    "candidates": plan.candidates,
                    "estimate_s": plan.estimate_s,
                    "estimate_measured": plan.measured,
                },
                indent=1,
            )
        )
        return
    from rich.table import Table

    known = [r.tokens for r in plan.rows]
    with_tokens = any(t is not None for t in known)
    title = f"plan: backend {backend.name} on {device.device_kind}, strategy {spec.strategy}"
    table = Table(title=cell(title + problem_cells.tokens_note(known)))
    shape_columns = ("op", "T", "m", "k,n,g") if with_tokens else ("op", "m", "k,n,g")
    columns = (
        "problem",
        *shape_columns,
        "valid",
        "pruned",
        "done before",
        "to run",
        "s per candidate",
        "note",
    )
    for column in columns:
        table.add_column(column)
    for r in plan.rows:  # labels come from model files: cells, never markup
        per_candidate = f"{r.compile_s:.2g} + {r.device_s:.2g} ({r.basis})" if r.basis else ""
        T = problem_cells.UNKNOWN if r.tokens is None else r.tokens
        m = r.m if r.filled_rows is None else f"{r.m} ({r.filled_rows} filled)"
        shape = (r.op, T, m, r.kng) if with_tokens else (r.op, m, r.kng)
        values = (r.label, *shape, r.valid, r.pruned, r.done, r.to_run, per_candidate, r.skipped)
        table.add_row(*map(cell, values))
    out = table_console()
    out.print(table)
    basis = "calibrated from earlier trials" if plan.measured else "a prior: no earlier trials"
    out.print(
        f"{plan.candidates} candidates; estimated {plan.estimate_s / 60:.1f} min on {plan.workers} workers "
        f"(per candidate: compile + device seconds, scaled by each problem's work; {basis})",
        markup=False,
        highlight=False,
    )


def _print_outcome(outcome, as_json: bool) -> None:
    from moetune.tuner import summary

    if as_json:
        rows = summary.outcome_json(outcome)
        result = {"sweep_id": outcome.sweep_id, "status": outcome.status, "problems": rows}
        typer.echo(json_text(result, indent=1))
        return
    from rich.table import Table

    from moetune.tuner.cli.problem_cells import tokens_note

    tokens = any(p.tokens is not None for p in outcome.problems)
    unknown = tokens_note([p.tokens for p in outcome.problems])
    if outcome.compile_target:
        title = f"compile-only sweep {outcome.sweep_id} ({outcome.backend} for {outcome.compile_target})"
        rows = [
            {"problem": p.label, "op": p.problem.op, "m": str(p.problem.m), "trials": summary.trials_cell(p)}
            | {"result": p.decision}
            for p in outcome.problems
        ]
        caption = None
    else:
        title = f"winners of sweep {outcome.sweep_id} ({outcome.backend} on {outcome.device_kind})"
        unit = summary.outcome_unit(outcome)
        rows = summary.outcome_cells(outcome, unit, tokens=tokens)
        caption = (
            f"times in {unit.name}; T tokens, m = T x top_k rows; winner: the median of the interleaved "
            "re-timing that decided it; heuristic and xla: re-timed beside it where they were finalists, "
            "else their sweep median, and then each ratio is against the winner's sweep median"
        )
    table = Table(title=cell(title + unknown), caption=None if caption is None else cell(caption))
    for header in rows[0] if rows else ():
        table.add_column(header)
    for row in rows:  # labels come from model files: cells, never markup
        table.add_row(*map(cell, row.values()))
    out = table_console()
    out.print(table)
    out.print(
        f"{outcome.trials} trials in {outcome.elapsed_s:.0f} s; report: moetune report {outcome.sweep_id}",
        markup=False,
        highlight=False,
    )
