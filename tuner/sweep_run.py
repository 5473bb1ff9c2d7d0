"""A sweep run to its end (or planned, with --dry-run) as `moetune tune` runs it, with its output and exit
codes: the command (cli/tune.py) and the queue's workers (tuner/job_runner.py) run this same code.

Exit codes (typer.Exit): 3 incomplete (some problem could not be decided, its finalists' re-timing failed
twice: --resume re-times it); 4 the sweep stopped (the database stopped accepting writes, or another process
took the sweep over); 130 interrupted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import NoReturn

import typer

from moetune.kernels.errors import MoetuneError
from moetune.tuner import problem_cells
from moetune.tuner.listings.json_values import json_text
from moetune.tuner.terminal import cell, err_console, table_console

EXIT_INCOMPLETE = 3
EXIT_STOPPED = 4


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


def store_holding_sweeps(db: str | None, sweep_id: int):
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
        valid, pruned = ("-", "-") if r.valid is None else (r.valid, r.pruned)
        values = (r.label, *shape, valid, pruned, r.done, r.to_run, per_candidate, r.skipped)
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

    tokens = any(p.tokens is not None for p in outcome.problems)
    unknown = problem_cells.tokens_note([p.tokens for p in outcome.problems])
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
