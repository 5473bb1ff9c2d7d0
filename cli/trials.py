"""`moetune trials`: the recorded trials, newest first, with filters; every trial, not only winners."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from moetune.cli import app
from moetune.cli.common import DbOption, check_range, choice, emit, err_console, fail
from moetune.cli.db_commands import BackendOption, GpuOption, JsonOption, check_known, opened_store
from moetune.db.records import TRIAL_STATUSES
from moetune.tuner import problem_cells as problems
from moetune.tuner.listings.tokens import SweepTokens
from moetune.tuner.listings.trials import trial_dict

if TYPE_CHECKING:
    from moetune.db.records import TrialRow

TrialStatus = choice("TrialStatus", TRIAL_STATUSES)


# Static metrics worth a glance in the table (FlyDSL's names); the JSON listing has them all.
_METRIC_LABELS = {"vgpr_count": "vgpr", "agpr_count": "agpr", "lds_bytes": "lds"}
_SPILL_METRICS = ("vgpr_spill_count", "sgpr_spill_count")


def _details_summary(details: dict[str, Any] | None) -> str:
    """One short line for a compile-only trial's details: binary hash prefix, registers, spills."""
    if not details:
        return ""
    parts = [f"bin {details['binary_hash'][:8]}"] if details.get("binary_hash") else []
    metrics = details.get("metrics") or {}
    parts += [f"{label}={metrics[key]}" for key, label in _METRIC_LABELS.items() if key in metrics]
    if any(key in metrics for key in _SPILL_METRICS):
        parts.append(f"spills={sum(metrics.get(key, 0) for key in _SPILL_METRICS)}")
    if details.get("duplicate_of") is not None:
        parts.append(f"dup of #{details['duplicate_of']}")
    return " ".join(parts)


def _trial_cells(
    row: TrialRow, tokens: int | None, unit: Any, *, details: bool, with_tokens: bool
) -> dict[str, Any]:
    from moetune.tuner import config_diff

    cells = {
        "id": row.id,
        "sweep": row.sweep_id,
        "gpu": row.device_kind,
        "backend": row.backend,
        **problems.cells(row.problem, tokens, with_tokens=with_tokens),
        "config (not default)": config_diff.text(row.backend, row.config),
        "status": row.status,
        f"median {unit.name}": unit.format(row.median_s),
        "error": row.error.splitlines()[0][:60] if row.error else "",
    }
    if details:  # only listings holding compile-only trials get the column
        cells["details"] = _details_summary(row.details)
    return cells


@app.command("trials")
def trials_command(
    db: DbOption = None,
    sweep: Annotated[int | None, typer.Option("--sweep", help="Sweep id.", show_default="all")] = None,
    backend: BackendOption = None,
    status: Annotated[
        TrialStatus | None, typer.Option("--status", help="Trials of this status only.", show_default="all")
    ] = None,
    gpu: GpuOption = None,
    problem: Annotated[
        str | None,
        typer.Option("--problem", help="Problem key (see `moetune best --json`).", show_default="all"),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", help="Newest N trials; 0 for all.")] = 100,
    as_json: JsonOption = False,
) -> None:
    """List recorded trials, newest first."""
    from moetune.tuner.durations import unit_for

    check_range("--limit", limit, low=0)
    check_range("--sweep", sweep)
    with opened_store(db, read_only=True) as store:
        # RecordNotFound names the id; its status (dead: its process stopped) goes into the title.
        sweep_row = store.get_sweep(sweep) if sweep is not None else None
        check_known("backend", backend, store.backends())
        check_known("gpu", gpu, store.device_kinds())
        if problem is not None and not store.has_problem(problem):
            fail(f"no problem {problem!r} in the database")
        rows = store.trials(
            sweep_id=sweep,
            backend=backend,
            status=None if status is None else status.value,
            device_kind=gpu,
            problem_key=problem,
            limit=limit or None,
        )
        sweep_tokens = SweepTokens(store)
        tokens = [sweep_tokens(r.sweep_id, r.problem.key) for r in rows]
    if limit and len(rows) == limit:  # there may be more: say so where it cannot spoil --json output
        err_console.print(
            f"showing the newest {limit} trials; --limit 0 lists all", markup=False, highlight=False
        )
    if as_json:
        emit([trial_dict(r, t) for r, t in zip(rows, tokens, strict=True)], as_json=True)
        return
    details = any(r.details and "target" in r.details for r in rows)  # compile-only trials
    unit = unit_for(r.median_s for r in rows)
    with_tokens = any(t is not None for t in tokens)
    cells = [
        _trial_cells(r, t, unit, details=details, with_tokens=with_tokens)
        for r, t in zip(rows, tokens, strict=True)
    ]
    of_sweep = f" of sweep {sweep_row.id} ({sweep_row.status})" if sweep_row else ""
    title = f"{len(rows)} trials{of_sweep} (newest first, times in {unit.name})" + problems.tokens_note(
        tokens
    )
    emit(cells, as_json=False, title=title)
