"""Database commands: `moetune db upgrade|current|downgrade`, `trials`, `best`, `misses`, `export`,
`import`, `rollback`.

Every command takes `--db URL` (default: $MOETUNE_DB, else SQLite in the user data directory). Bad
input gets one line on stderr and exit code 2, and is caught before anything is written: filter values
are checked against what the database knows, and a pack is validated completely before the import.
`best` also lists the config packs dispatch reads, read through moetune.kernels.lookup as dispatch does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from moetune.kernels.errors import MoetuneError, PackInvalid
from moetune.tuner.cli import app
from moetune.tuner.cli.common import (
    DbOption,
    check_output_file,
    check_range,
    console,
    emit,
    err_console,
    fail,
    printable,
)

if TYPE_CHECKING:
    from moetune.db import Store
    from moetune.db.records import TrialRow, WinnerRow
    from moetune.kernels.device import DeviceFingerprint
    from moetune.kernels.lookup import Winner

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
GpuOption = Annotated[
    str | None, typer.Option("--gpu", help="GPU model (jax device_kind), e.g. 'NVIDIA H200'.")
]
BackendOption = Annotated[str | None, typer.Option("--backend", help="Backend name, e.g. mosaic_gpu.")]

db_app = typer.Typer(help="The database schema: upgrade, show the revision, downgrade.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@contextlib.contextmanager
def opened_store(db: str | None, *, check_schema: bool = True, read_only: bool = False) -> Iterator[Store]:
    """The store for --db (one that never writes, with `read_only`); any moetune error (database,
    schema, pack) ends the command via fail()."""
    from moetune.db import open_store

    try:
        store = open_store(db, check_schema=check_schema, read_only=read_only)
    except MoetuneError as e:
        fail(str(e))
    try:
        yield store
    except MoetuneError as e:
        fail(str(e))
    finally:
        store.close()


def say(message: str) -> None:
    """One plain line on stdout (no rich markup: URLs and configs may hold brackets)."""
    console.print(printable(message), markup=False, highlight=False, soft_wrap=True)


def warn(message: str) -> None:
    """One plain line on stderr; the command goes on."""
    err_console.print(f"warning: {printable(message)}", markup=False, highlight=False, soft_wrap=True)


def _check_known(name: str, value: str | None, known: list[str], where: str = "the database") -> None:
    if value is not None and value not in known:
        fail(f"no {name} {value!r} in {where}; known: {', '.join(map(repr, known)) or 'none'}")


# --- schema ---------------------------------------------------------------------------------------


@db_app.command("upgrade")
def db_upgrade(
    db: DbOption = None,
    revision: Annotated[str, typer.Option("--revision", help="Target revision.")] = "head",
) -> None:
    """Migrate the database schema to the newest revision (creates a new database)."""
    _check_revision(revision, "head")
    with opened_store(db, check_schema=False) as store:
        before = store.schema_state()
        store.upgrade(revision)
        after = store.revision()
    if before.revision == after:
        say(f"{store.url}: already at schema revision {after}")
    else:
        say(f"{store.url}: schema revision {before.revision or '(none)'} -> {after}")


@db_app.command("current")
def db_current(db: DbOption = None, as_json: JsonOption = False) -> None:
    """Show the database's schema revision and whether this moetune can use it."""
    with opened_store(db, check_schema=False, read_only=True) as store:
        state = store.schema_state()
    note = (
        state.problem()
        or {
            "missing": "not created yet; created on first use",
            "empty": "no moetune tables yet; created on first use",
            "current": "up to date",
        }[state.status]
    )
    if as_json:
        row = {"url": state.url, "revision": state.revision, "head": state.head, "status": state.status}
        emit([row | {"note": note}], as_json=True)
    else:
        say(f"{state.url}: schema revision {state.revision or '(none)'}, head {state.head}: {note}")


@db_app.command("downgrade")
def db_downgrade(
    revision: Annotated[str, typer.Argument(help="Target revision; 'base' removes every moetune table.")],
    db: DbOption = None,
    yes: Annotated[
        bool, typer.Option("--yes", help="Confirm: tables of later revisions and their data are dropped.")
    ] = False,
) -> None:
    """Migrate the database schema back to an older revision (drops data of later revisions)."""
    if not yes:
        fail(f"downgrading to {revision} drops the tables of later revisions with their data; add --yes")
    _check_revision(revision, "base")
    with opened_store(db, check_schema=False) as store:
        if store.schema_state().status in ("missing", "empty"):  # nothing to downgrade; create nothing
            fail(f"{store.url} holds no moetune tables to downgrade")
        store.downgrade(revision)
        after = store.revision()
    say(f"{store.url}: schema revision now {after or '(none)'}")


def _check_revision(revision: str, alias: str) -> None:
    from moetune.db.schema import known_revisions

    known = known_revisions()
    if revision != alias and revision not in known:
        fail(f"no schema revision {revision!r}; known: {alias}, {', '.join(sorted(known))}")


# --- queries --------------------------------------------------------------------------------------


def _trial_dict(row: TrialRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "sweep_id": row.sweep_id,
        "device_kind": row.device_kind,
        "fingerprint_hash": row.fingerprint_hash,
        "backend": row.backend,
        "source_hash": row.source_hash,
        "problem": row.problem.key,
        "config": row.config,
        "status": row.status,
        "median_s": row.median_s,
        "samples_s": list(row.samples_s),
        "compile_s": row.compile_s,
        "verify_error": row.verify_error,
        "error": row.error,
        "host": row.host,
        "worker": row.worker,
        "routing": row.routing,
        "details": row.details,
        "started_at": row.started_at,
        "finished_at": row.finished_at,
    }


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


def _trial_cells(row: TrialRow, *, details: bool) -> dict[str, Any]:
    p = row.problem
    cells = {
        "id": row.id,
        "sweep": row.sweep_id,
        "gpu": row.device_kind,
        "backend": row.backend,
        "m,k,n,g": f"{p.m},{p.k},{p.n},{p.g}",
        "config": row.config,
        "status": row.status,
        "median_us": None if row.median_s is None else row.median_s * 1e6,
        "error": row.error.splitlines()[0][:60] if row.error else "",
    }
    if details:  # only listings holding compile-only trials get the column
        cells["details"] = _details_summary(row.details)
    return cells


@app.command("trials")
def trials_command(
    db: DbOption = None,
    sweep: Annotated[int | None, typer.Option("--sweep", help="Sweep id.")] = None,
    backend: BackendOption = None,
    status: Annotated[
        str | None, typer.Option("--status", help="ok, compile_error, wrong_result, ...")
    ] = None,
    gpu: GpuOption = None,
    problem: Annotated[
        str | None, typer.Option("--problem", help="Problem key (see `moetune best`).")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", help="Newest N trials; 0 for all.")] = 100,
    as_json: JsonOption = False,
) -> None:
    """List recorded trials, newest first."""
    from moetune.db.records import TRIAL_STATUSES

    if status is not None and status not in TRIAL_STATUSES:
        fail(f"--status {status!r} is not one of {', '.join(TRIAL_STATUSES)}")
    check_range("--limit", limit, low=0)
    check_range("--sweep", sweep)
    with opened_store(db, read_only=True) as store:
        # RecordNotFound names the id; its status (dead: its process stopped) goes into the title.
        sweep_row = store.get_sweep(sweep) if sweep is not None else None
        _check_known("backend", backend, store.backends())
        _check_known("gpu", gpu, store.device_kinds())
        if problem is not None and not store.has_problem(problem):
            fail(f"no problem {problem!r} in the database")
        rows = store.trials(
            sweep_id=sweep,
            backend=backend,
            status=status,
            device_kind=gpu,
            problem_key=problem,
            limit=limit or None,
        )
    if limit and len(rows) == limit:  # there may be more: say so where it cannot spoil --json output
        err_console.print(
            f"showing the newest {limit} trials; --limit 0 lists all", markup=False, highlight=False
        )
    if as_json:
        emit([_trial_dict(r) for r in rows], as_json=True)
    else:
        details = any(r.details and "target" in r.details for r in rows)  # compile-only trials
        cells = [_trial_cells(r, details=details) for r in rows]
        of_sweep = f" of sweep {sweep_row.id} ({sweep_row.status})" if sweep_row else ""
        emit(cells, as_json=False, title=f"{len(rows)} trials{of_sweep} (newest first)")


@dataclasses.dataclass(frozen=True)
class _Listed:
    """One row of `moetune best`: a database winner (with its `row`) or an entry of a config pack."""

    device_kind: str
    winner: Winner
    origin: str  # "database", or the pack's file name
    reason: str
    row: WinnerRow | None = None
    freshness: str = ""  # fresh | stale | other device | unknown: see _Stack.freshness
    stale: tuple[str, ...] = ()

    @property
    def order(self) -> tuple[str, str, str, int, bool]:
        p = self.winner.problem
        return self.device_kind, self.winner.backend, p.shape_key, p.m, self.row is None


class _Stack:
    """This machine's device fingerprint and kernel sources: what makes a winner fresh or stale here."""

    def __init__(self) -> None:
        from moetune.kernels.device import current_fingerprint

        # Reading the fingerprint opens the device; a listing must not reserve most of a GPU's memory.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        try:
            self.device: DeviceFingerprint | None = current_fingerprint()
        except Exception:  # no usable device (a broken driver, say): rows list with freshness unknown
            self.device = None
        self._sources: dict[str, str | None] = {}

    def source_hash(self, backend: str) -> str | None:
        from moetune.kernels import registry

        if backend not in self._sources:
            try:
                self._sources[backend] = registry.get(backend).source_hash()
            except Exception:  # not a backend here, its dependency is missing, its source is not files
                self._sources[backend] = None
        return self._sources[backend]

    def freshness(self, listed: _Listed) -> _Listed:
        """fresh: tuned on this device with this kernel source; stale: either differs (with why); other
        device: the kernel source is current, the device is not this machine's; unknown: no way to tell."""
        from moetune.kernels.lookup import stale_reasons

        here = self.device is not None and self.device.device_kind == listed.device_kind
        source_hash = self.source_hash(listed.winner.backend)
        stale = stale_reasons(listed.winner, self.device.hash if here else None, source_hash)
        if stale:
            verdict = "stale"
        elif source_hash is None:
            verdict = "unknown"
        else:
            verdict = "fresh" if here else "other device"
        return dataclasses.replace(listed, freshness=verdict, stale=stale)


def _pack_winners() -> list[_Listed]:
    """The winners of the config packs dispatch reads, as dispatch reads them (kernels.lookup); a pack
    dispatch would ignore is named on stderr and left out."""
    from moetune.kernels import packs
    from moetune.kernels.lookup import LOOKUP, pack_winners, read_pack

    folder = LOOKUP.packs_folder()
    if folder is None or not folder.is_dir():
        return []
    listed = []
    for resource in sorted(folder.iterdir(), key=lambda r: r.name):
        if not resource.name.endswith(".json"):
            continue
        try:
            pack = read_pack(resource)
        except PackInvalid as e:
            warn(f"ignoring config pack: {e}")
            continue
        expected = packs.file_name(pack.device.device_kind, pack.backend)
        if resource.name != expected:  # dispatch looks packs up by this name only
            warn(
                f"ignoring config pack {resource.name}: it holds {pack.backend} winners for "
                f"{pack.device.device_kind!r}, which dispatch reads from {expected}"
            )
            continue
        reason = f"config pack created {pack.created}"
        listed += [_Listed(pack.device.device_kind, w, resource.name, reason) for w in pack_winners(pack)]
    return listed


def _winner_dict(listed: _Listed) -> dict[str, Any]:
    w, row = listed.winner, listed.row
    return {
        "id": row.id if row else None,
        "trial_id": row.trial_id if row else None,
        "device_kind": listed.device_kind,
        "fingerprint_hash": w.fingerprint_hash,
        "backend": w.backend,
        "source_hash": w.source_hash,
        "problem": w.problem.to_dict() | {"key": w.problem.key},
        "config": dict(w.config),
        "median_s": w.median_s,
        "promoted_at": row.promoted_at if row else None,
        "state": row.state if row else "active",
        "reason": listed.reason,
        "origin": listed.origin,
        "freshness": listed.freshness,
        "stale": list(listed.stale),
    }


def _winner_cells(listed: _Listed, *, history: bool) -> dict[str, Any]:
    p = listed.winner.problem
    cells = {
        "gpu": listed.device_kind,
        "backend": listed.winner.backend,
        "m": p.m,
        "k,n,g": f"{p.k},{p.n},{p.g}",
        "dtypes": ",".join(dict.fromkeys((p.lhs_dtype, p.rhs_dtype, p.out_dtype)))
        + (",t" if p.transpose_rhs else ""),
        "config": dict(listed.winner.config),
        "median_us": None if listed.winner.median_s is None else listed.winner.median_s * 1e6,
        "from": listed.origin,
        "here": listed.freshness,
    }
    if history:
        cells["state"] = listed.row.state if listed.row else "active"
    return cells


@app.command("best")
def best(
    db: DbOption = None,
    gpu: GpuOption = None,
    backend: BackendOption = None,
    m: Annotated[int | None, typer.Option("--m", help="Token rows (M).")] = None,
    k: Annotated[int | None, typer.Option("--k", help="Contraction size (K).")] = None,
    n: Annotated[int | None, typer.Option("--n", help="Output columns (N).")] = None,
    g: Annotated[int | None, typer.Option("--g", help="Experts (G).")] = None,
    history: Annotated[
        bool, typer.Option("--history", help="Include superseded and rolled-back winners.")
    ] = False,
    with_packs: Annotated[
        bool,
        typer.Option(
            "--packs/--no-packs", help="Also list the winners of the config packs in configs/tuned/."
        ),
    ] = True,
    as_json: JsonOption = False,
) -> None:
    """Show the tuned winners (best configs) per GPU model, backend and problem: the database's and the
    config packs', each with where it came from and whether it is fresh on this machine."""
    from moetune.kernels.lookup import db_winner

    for option, value in (("--m", m), ("--k", k), ("--n", n), ("--g", g)):
        check_range(option, value)
    shipped = _pack_winners() if with_packs else []
    where = "the database or the config packs" if with_packs else "the database"
    with opened_store(db, read_only=True) as store:
        _check_known("gpu", gpu, sorted({*store.device_kinds(), *(r.device_kind for r in shipped)}), where)
        _check_known(
            "backend", backend, sorted({*store.backends(), *(r.winner.backend for r in shipped)}), where
        )
        rows = store.winners(device_kind=gpu, backend=backend, m=m, k=k, n=n, g=g, active_only=not history)
    listed = [_Listed(r.device_kind, db_winner(r), "database", r.reason, row=r) for r in rows]
    for entry in shipped:
        p = entry.winner.problem
        wanted = (gpu, backend, m, k, n, g)
        actual = (entry.device_kind, entry.winner.backend, p.m, p.k, p.n, p.g)
        if all(w in (None, a) for w, a in zip(wanted, actual, strict=True)):
            listed.append(entry)
    if listed:
        stack = _Stack()
        listed = sorted((stack.freshness(item) for item in listed), key=lambda item: item.order)
    if as_json:
        emit([_winner_dict(item) for item in listed], as_json=True)
    else:
        origins = len({item.origin for item in listed})
        emit(
            [_winner_cells(item, history=history) for item in listed],
            as_json=False,
            title=f"{len(listed)} winners" + (f" from {origins} sources" if origins > 1 else ""),
        )


@app.command("misses")
def misses_command(
    db: DbOption = None, gpu: GpuOption = None, backend: BackendOption = None, as_json: JsonOption = False
) -> None:
    """Show dispatch lookups that found no winner, most frequent first (what to tune next)."""
    with opened_store(db, read_only=True) as store:
        _check_known("gpu", gpu, store.device_kinds())
        _check_known("backend", backend, store.backends())
        rows = store.misses(device_kind=gpu, backend=backend)
    emit(
        [
            {
                "gpu": r.device_kind,
                "backend": r.backend,
                "problem": r.problem.key,
                "count": r.count,
                "last_seen": r.last_seen,
            }
            for r in rows
        ],
        as_json=as_json,
    )


# --- config packs and rollback --------------------------------------------------------------------


@app.command("export")
def export(
    gpu: Annotated[str, typer.Option("--gpu", help="GPU model (jax device_kind), e.g. 'NVIDIA H200'.")],
    backend: Annotated[str, typer.Option("--backend", help="Backend name.")],
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Pack file (default: <gpu>__<backend>.json).")
    ] = None,
    db: DbOption = None,
) -> None:
    """Write the active winners of one GPU model and backend to a config pack (versioned JSON)."""
    from moetune.kernels import packs

    target = output or Path(packs.file_name(gpu, backend))
    check_output_file("--output", target)
    with opened_store(db, read_only=True) as store:
        pack = store.export_pack(device_kind=gpu, backend=backend)
        total = len(store.winners(device_kind=gpu, backend=backend))
    _write_atomically(target, pack.dumps() + "\n")
    say(
        f"exported {len(pack.entries)} winners for {gpu} / {backend} (fingerprint {pack.device.hash}, "
        f"kernel source {pack.kernel_source_hash}) to {target}"
    )
    if total > len(pack.entries):
        say(f"left out {total - len(pack.entries)} winners tuned under other fingerprints or kernel sources")


def _write_atomically(path: Path, text: str) -> None:
    """Readers never see half a pack, and a failed write leaves no file behind."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        fail(f"cannot write {path}: {e.strerror or e}")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        fail(f"cannot write {path}: {e.strerror or e}")


@app.command("import")
def import_command(
    file: Annotated[Path, typer.Argument(help="Config pack file (JSON) from `moetune export`.")],
    db: DbOption = None,
) -> None:
    """Import a config pack: its winners become the active ones (the previous winners stay as history)."""
    from moetune.db.pack_io import check_pack
    from moetune.kernels import packs

    try:
        pack = check_pack(packs.load(file), str(file))  # all of it, before the database is touched
    except MoetuneError as e:
        fail(str(e))
    with opened_store(db) as store:
        imported = store.import_pack(pack, source=str(file))
    say(
        f"imported {imported} winners for {pack.device.device_kind} / {pack.backend} from {file} "
        f"({len(pack.entries) - imported} already current)"
    )


@app.command("rollback")
def rollback(
    backend: Annotated[str, typer.Option("--backend", help="Backend name.")],
    problem: Annotated[str, typer.Option("--problem", help="Problem key (`moetune best --json` shows it).")],
    gpu: GpuOption = None,
    fingerprint: Annotated[str | None, typer.Option("--fingerprint", help="Device fingerprint hash.")] = None,
    db: DbOption = None,
) -> None:
    """Withdraw the active winner of a problem and restore the one it replaced."""
    if (gpu is None) == (fingerprint is None):
        fail("give exactly one of --gpu or --fingerprint")
    with opened_store(db) as store:
        restored = store.rollback(
            backend=backend, problem_key=problem, fingerprint_hash=fingerprint, device_kind=gpu
        )
    say(
        f"restored winner {restored.id} (trial {restored.trial_id}, config {restored.config}, promoted "
        f"{restored.promoted_at:%Y-%m-%d %H:%M}) for {restored.device_kind} / {backend} / {problem}"
    )
