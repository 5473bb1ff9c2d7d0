"""Config packs in and out of the database (the file format itself is moetune.kernels.packs).

Import validates the whole pack first (`check_pack`: every entry is one dispatch would trust,
kernels.lookup.trusted_pack_entries: the backend exists here, every config has its Config's types and
rules, and its search space would not call it invalid), so a bad pack writes nothing
at all. It then writes the entries in chunks of IMPORT_CHUNK_ENTRIES, one transaction each, so that a
sweep writing its trials beside a large import waits for one chunk, never for the whole pack (a single
transaction of 20,000 entries held SQLite's write lock for a minute). A database failure part-way leaves
the chunks before it imported and the import's sweep row marked failed; importing the pack again
finishes it, since entries that already are the active winner are skipped.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from moetune.db import entities, trials, winners
from moetune.db.errors import RecordNotFound
from moetune.db.models import Device, Kernel, Sweep, Winner
from moetune.db.records import TrialRecord, canonical_config
from moetune.kernels import packs
from moetune.kernels.errors import MoetuneError, PackInvalid
from moetune.kernels.lookup import trusted_pack_entries
from moetune.kernels.packs import Pack, PackEntry

IMPORT_CHUNK_ENTRIES = 200
# Between chunks on SQLite. A writer waiting for SQLite's lock retries at most every 100 ms (its busy
# handler's longest sleep), so a longer pause lets it in; without one the importer, already waiting, takes
# the lock back at once. PostgreSQL queues waiting writers itself.
SQLITE_CHUNK_PAUSE_S = 0.12
# The import's sweep row records where the pack came from in a String(1024) column.
SOURCE_LENGTH = Sweep.__table__.c.sweep_file.type.length


def export_pack(session: Session, *, device_kind: str, backend: str) -> Pack:
    """The active winners of one GPU model and backend.

    A pack holds one fingerprint and one kernel source hash, so when winners were tuned under several,
    the pack takes those of the most recent promotion; callers can compare its size with `winners()`.
    """
    rows = winners.winners(session, device_kind=device_kind, backend=backend)
    if not rows:
        pairs = session.execute(
            select(Device.device_kind, Winner.backend)
            .join(Device, Winner.device_id == Device.id)
            .where(Winner.state == "active")
            .distinct()
        )
        have = ", ".join(f"{kind} / {name}" for kind, name in sorted(pairs)) or "none"
        raise RecordNotFound(
            f"no winners for gpu={device_kind!r} backend={backend!r}; winners exist for: {have}"
        )
    newest = max(rows, key=lambda w: (w.promoted_at, w.id))
    chosen = sorted(
        (
            w
            for w in rows
            if (w.fingerprint_hash, w.source_hash) == (newest.fingerprint_hash, newest.source_hash)
        ),
        key=lambda w: w.problem,
    )
    return Pack(
        device=newest.device,
        backend=backend,
        kernel_source_hash=newest.source_hash,
        entries=tuple(PackEntry(w.problem, w.config, w.median_s) for w in chosen),
        # When its newest winner was promoted: the same winners export to the same pack, byte for byte
        # (the service's ETag is a hash of it).
        created=newest.promoted_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


def check_pack(pack: Pack, source: str = "<pack>") -> Pack:
    """The pack with every config normalised by its backend's Config; PackInvalid names the first entry
    that dispatch would not trust (kernels.lookup.trusted_pack_entries, the one policy for both). A pack
    built in Python rather than read from a file gets the file's checks too (packs.parse of its dict)."""
    if len(source) > SOURCE_LENGTH:
        raise PackInvalid(
            f"the pack's path has {len(source)} characters; the database records {SOURCE_LENGTH}"
        )
    pack = packs.parse(pack.to_dict(), source)
    trusted, rejected = trusted_pack_entries(pack)
    if rejected:
        raise PackInvalid(f"{source}: {rejected[0]}")
    entries = tuple(PackEntry(e.problem, config.to_dict(), e.median_s) for e, config in trusted)
    return Pack(pack.device, pack.backend, pack.kernel_source_hash, entries, pack.created)


def chunk_pause_s(dialect: str) -> float:
    return SQLITE_CHUNK_PAUSE_S if dialect == "sqlite" else 0.0


def import_pack(
    run: Callable[[Callable[[Session], Any]], Any],
    pack: Pack,
    *,
    source: str,
    host: str,
    user: str,
    ids: entities.KnownIds | None = None,
    pause_s: float = 0.0,
) -> int:
    """Write a checked pack's entries as trials and promote them; returns how many winners changed.

    `run(fn)` runs fn(session) in one write transaction (Store's); each chunk of IMPORT_CHUNK_ENTRIES
    entries is one call, with `pause_s` between calls. Entries whose config already is the active winner
    (same fingerprint, backend, source hash and problem) are skipped, so importing a pack twice changes
    nothing the second time.
    """
    chunks = [
        pack.entries[start : start + IMPORT_CHUNK_ENTRIES]
        for start in range(0, len(pack.entries), IMPORT_CHUNK_ENTRIES)
    ]
    sweep_id, imported = None, 0
    try:
        for n, chunk in enumerate(chunks):
            if n and pause_s:
                time.sleep(pause_s)
            write = functools.partial(
                _write_chunk,
                pack=pack,
                chunk=chunk,
                sweep_id=sweep_id,
                last=n == len(chunks) - 1,
                source=source,
                host=host,
                user=user,
                ids=ids,
            )
            # run() may call write again after a conflict: what it returns is what was committed.
            sweep_id, count = run(write)
            imported += count
    except BaseException:
        if sweep_id is not None:
            try:
                run(functools.partial(trials.finish_sweep, sweep_id=sweep_id, status="failed"))
            except MoetuneError:  # the database is failing already; the first error is the one to report
                pass
        raise
    return imported


def _write_chunk(
    session: Session,
    *,
    pack: Pack,
    chunk: tuple[PackEntry, ...],
    sweep_id: int | None,
    last: bool,
    source: str,
    host: str,
    user: str,
    ids: entities.KnownIds | None,
) -> tuple[int | None, int]:
    """One chunk of an import in one transaction: (the import's sweep id, or None while no entry needed
    writing, and how many winners this chunk changed). The sweep row is created with the first entry
    written, as "running", and marked done by the last chunk."""
    family = session.scalar(
        select(Kernel.family)
        .where(Kernel.backend == pack.backend, Kernel.source_hash == pack.kernel_source_hash)
        .order_by(Kernel.id)
        .limit(1)
    )
    imported = 0
    for entry in chunk:
        current = winners.current_winner(
            session, fingerprint_hash=pack.device.hash, backend=pack.backend, problem_key=entry.problem.key
        )
        if (
            current is not None
            and current.source_hash == pack.kernel_source_hash
            and canonical_config(current.config) == canonical_config(entry.config)
        ):
            continue
        if sweep_id is None:
            sweep_id = trials.create_sweep(
                session,
                backend=pack.backend,
                strategy="import",
                spec={"source": source, "pack_created": pack.created, "entries": len(pack.entries)},
                host=host,
                user=user,
                sweep_file=source,
            )
        record = TrialRecord(
            sweep_id=sweep_id,
            device=pack.device,
            backend=pack.backend,
            # Packs do not carry the kernel family: reuse the one known for this source, if any.
            family=family or "",
            source_hash=pack.kernel_source_hash,
            problem=entry.problem,
            config=entry.config,
            status="ok",
            median_s=entry.median_s,
            host=host,
            worker="pack-import",
        )
        trial_id = trials.record_trial(session, record, ids)
        winners.promote(session, trial_id, reason=f"imported from {source}")
        imported += 1
    if last and sweep_id is not None:
        trials.finish_sweep(session, sweep_id, "done")
    return sweep_id, imported
