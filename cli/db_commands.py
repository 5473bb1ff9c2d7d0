"""Database commands: `moetune db upgrade|current|downgrade`, `export`, `import`, `rollback`, and what
every database command shares (`trials`, `best`, `misses` and `sweeps` have modules of their own).

Every command takes `--db URL` (default: $MOETUNE_DB, else SQLite in the user data directory) and
`--json`. Bad input gets one line on stderr and exit code 2, and is caught before anything is written:
filter values are checked against what the database knows, and a pack is validated completely before
the import.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from moetune.cli import app
from moetune.cli.common import (
    DbOption,
    JsonOption,
    check_output_file,
    console,
    emit,
    err_console,
    fail,
    json_text,
    not_regular_file,
    printable,
)
from moetune.kernels.errors import MoetuneError

if TYPE_CHECKING:
    from moetune.db import Store
    from moetune.db.records import WinnerRow

__all__ = ["BackendOption", "GpuOption", "JsonOption", "check_known", "opened_store", "say", "warn"]

GpuOption = Annotated[
    str | None,
    typer.Option("--gpu", help="GPU model (jax device_kind), e.g. 'NVIDIA H200'.", show_default="all"),
]
BackendOption = Annotated[
    str | None, typer.Option("--backend", help="Backend name, e.g. mosaic_gpu.", show_default="all")
]

db_app = typer.Typer(help="The database schema: upgrade, show the revision, downgrade.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@contextlib.contextmanager
def opened_store(
    db: str | None, *, check_schema: bool = True, read_only: bool = False, existing: bool = False
) -> Iterator[Store]:
    """The store for --db (one that never writes, with `read_only`); any moetune error (database,
    schema, pack) ends the command via fail(). With `existing`, a database not created yet (or holding
    no tables) is refused as it is, not created and migrated: a command that changes what is there
    (rollback) has nothing to work on in it."""
    from moetune.db import open_store

    try:
        if existing:
            refuse_missing_database(db)
        store = open_store(db, check_schema=check_schema, read_only=read_only)
    except MoetuneError as e:
        fail(str(e))
    try:
        yield store
    except MoetuneError as e:
        fail(str(e))
    finally:
        store.close()


def refuse_missing_database(db: str | None) -> None:
    """NoDatabase (naming the fix) when `db` does not exist yet or holds no tables; creates nothing."""
    from moetune.db import Store

    probe = Store(db)
    try:
        probe.check_readable()
    finally:
        probe.close()


def say(message: str) -> None:
    """One plain line on stdout (no rich markup: URLs and configs may hold brackets)."""
    console.print(printable(message), markup=False, highlight=False, soft_wrap=True)


def done(result: dict[str, Any], lines: list[str], *, as_json: bool) -> None:
    """What a command that changed something did: `result` as one JSON object, or `lines` as text."""
    if as_json:
        typer.echo(json_text(result, indent=1))
        return
    for line in lines:
        say(line)


def warn(message: str) -> None:
    """One plain line on stderr; the command goes on."""
    err_console.print(f"warning: {printable(message)}", markup=False, highlight=False, soft_wrap=True)


def check_known(name: str, value: str | None, known: list[str], where: str = "the database") -> None:
    if value is not None and value not in known:
        fail(f"no {name} {value!r} in {where}; known: {', '.join(map(repr, known)) or 'none'}")


# --- schema ---------------------------------------------------------------------------------------


@db_app.command("upgrade")
def db_upgrade(
    db: DbOption = None,
    revision: Annotated[str, typer.Option("--revision", help="Target revision.")] = "head",
    as_json: JsonOption = False,
) -> None:
    """Migrate the database schema to the newest revision (creates a new database)."""
    _check_revision(revision, "head")
    with opened_store(db, check_schema=False) as store:
        before = store.schema_state()
        store.upgrade(revision)
        after = store.revision()
    if before.revision == after:
        line = f"{store.url}: already at schema revision {after}"
    else:
        line = f"{store.url}: schema revision {before.revision or '(none)'} -> {after}"
    result = {
        "url": store.url,
        "before": before.revision,
        "revision": after,
        "changed": before.revision != after,
    }
    done(result, [line], as_json=as_json)


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
    as_json: JsonOption = False,
) -> None:
    """Migrate the database schema back to an older revision (drops data of later revisions)."""
    if not yes:
        fail(f"downgrading to {revision} drops the tables of later revisions with their data; add --yes")
    _check_revision(revision, "base")
    with opened_store(db, check_schema=False) as store:
        before = store.schema_state()
        if not before.holds_tables:  # nothing to downgrade; create nothing
            fail(f"{store.url} holds no moetune tables to downgrade")
        store.downgrade(revision)
        after = store.revision()
    result = {
        "url": store.url,
        "before": before.revision,
        "revision": after,
        "changed": before.revision != after,
    }
    done(result, [f"{store.url}: schema revision now {after or '(none)'}"], as_json=as_json)


def _check_revision(revision: str, alias: str) -> None:
    from moetune.db.schema import known_revisions

    known = known_revisions()
    if revision != alias and revision not in known:
        fail(f"no schema revision {revision!r}; known: {alias}, {', '.join(sorted(known))}")


# --- config packs and rollback --------------------------------------------------------------------


@app.command("export")
def export(
    gpu: Annotated[str, typer.Option("--gpu", help="GPU model (jax device_kind), e.g. 'NVIDIA H200'.")],
    backend: Annotated[str, typer.Option("--backend", help="Backend name.")],
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Pack file.", show_default="<gpu>__<backend>.json")
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Write the active winners of one GPU model and backend to a config pack (versioned JSON)."""
    from moetune.kernels import packs

    target = output or Path(packs.file_name(gpu, backend))
    check_output_file("--output", target)
    with opened_store(db, read_only=True) as store:
        pack = store.export_pack(device_kind=gpu, backend=backend)
        total = len(store.winners(device_kind=gpu, backend=backend))
    _write_atomically(target, pack.dumps() + "\n")
    left_out = total - len(pack.entries)
    lines = [
        f"exported {len(pack.entries)} winners for {gpu} / {backend} (fingerprint {pack.device.hash}, "
        f"kernel source {pack.kernel_source_hash}) to {target}"
    ]
    if left_out > 0:
        lines.append(f"left out {left_out} winners tuned under other fingerprints or kernel sources")
    result = {
        "file": str(target),
        "device_kind": gpu,
        "backend": backend,
        "fingerprint_hash": pack.device.hash,
        "kernel_source_hash": pack.kernel_source_hash,
        "exported": len(pack.entries),
        "left_out": max(0, left_out),
    }
    done(result, lines, as_json=as_json)


def _write_atomically(path: Path, text: str) -> None:
    """Readers never see half a pack, and a failed write leaves no file behind. Only a regular file is
    replaced (the rename would turn a device node, FIFO or symlink into a regular file), and the pack gets
    the mode a plain new file gets (0666 less the umask; an existing file's own mode), not mkstemp's 0600."""
    kind = not_regular_file(path)
    if kind:
        fail(f"--output {path} is {kind}, not a regular file; name a new or regular file")
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        fail(f"cannot write {path}: {e.strerror or e}")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            os.fchmod(f.fileno(), mode)
        kind = not_regular_file(path)  # it may have appeared while the pack was written
        if kind:
            raise IsADirectoryError(f"{path} became {kind}")
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        fail(f"cannot write {path}: {e.strerror or e}")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@app.command("import")
def import_command(
    file: Annotated[Path, typer.Argument(help="Config pack file (JSON) from `moetune export`.")],
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Import a config pack: its winners become the active ones (the previous winners stay as history)."""
    from moetune.db.pack_io import check_pack
    from moetune.kernels import packs

    try:
        pack = check_pack(packs.load(file), str(file))  # all of it, before the database is touched
    except MoetuneError as e:
        fail(str(e))
    with opened_store(db) as store:
        imported = store.import_pack(pack, source=str(file), checked=True)
    line = (
        f"imported {imported} winners for {pack.device.device_kind} / {pack.backend} from {file} "
        f"({len(pack.entries) - imported} already current)"
    )
    result = {
        "file": str(file),
        "device_kind": pack.device.device_kind,
        "backend": pack.backend,
        "imported": imported,
        "already_current": len(pack.entries) - imported,
    }
    done(result, [line], as_json=as_json)


@app.command("rollback")
def rollback(
    backend: Annotated[str, typer.Option("--backend", help="Backend name.")],
    problem: Annotated[str, typer.Option("--problem", help="Problem key (`moetune best --json` shows it).")],
    gpu: Annotated[
        str | None,
        typer.Option("--gpu", help="GPU model (jax device_kind); or --fingerprint.", show_default="none"),
    ] = None,
    fingerprint: Annotated[
        str | None,
        typer.Option("--fingerprint", help="Device fingerprint hash; or --gpu.", show_default="none"),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Withdraw the active winner of a problem and restore the one it replaced."""
    from moetune.tuner import config_diff

    if (gpu is None) == (fingerprint is None):
        fail("give exactly one of --gpu or --fingerprint")
    with opened_store(db, existing=True) as store:
        restored = store.rollback(
            backend=backend, problem_key=problem, fingerprint_hash=fingerprint, device_kind=gpu
        )
    line = (
        f"restored winner {restored.id} (trial {restored.trial_id}, config "
        f"{config_diff.text(backend, restored.config)}, promoted {restored.promoted_at:%Y-%m-%d %H:%M}) "
        f"for {restored.device_kind} / {backend} / {problem}"
    )
    done({"restored": _restored_dict(restored)}, [line], as_json=as_json)


def _restored_dict(row: WinnerRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "trial_id": row.trial_id,
        "device_kind": row.device_kind,
        "fingerprint_hash": row.fingerprint_hash,
        "backend": row.backend,
        "problem": row.problem.key,
        "config": row.config,
        "median_s": row.median_s,
        "promoted_at": row.promoted_at,
        "reason": row.reason,
        "decision": row.decision,
    }
