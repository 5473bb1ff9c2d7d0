"""Config packs in and out of the database (the file format itself is moetune.kernels.packs).

Import validates the whole pack first (`check_pack`: every entry is one dispatch would trust, the
backend exists here and every config is valid for it), then writes everything in one transaction, so a
bad pack writes nothing at all.
"""

from __future__ import annotations

import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from moetune.db import trials, winners
from moetune.db.errors import RecordNotFound
from moetune.db.models import Device, Kernel, Winner
from moetune.db.records import TrialRecord, canonical_config
from moetune.kernels.errors import PackInvalid
from moetune.kernels.lookup import trusted_pack_entries
from moetune.kernels.packs import Pack, PackEntry


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
        created=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


def check_pack(pack: Pack, source: str = "<pack>") -> Pack:
    """The pack with every config normalised by its backend's Config; PackInvalid names the first entry
    that dispatch would not trust (kernels.lookup.trusted_pack_entries, the one policy for both)."""
    trusted, rejected = trusted_pack_entries(pack)
    if rejected:
        raise PackInvalid(f"{source}: {rejected[0]}")
    entries = tuple(PackEntry(e.problem, config.to_dict(), e.median_s) for e, config in trusted)
    return Pack(pack.device, pack.backend, pack.kernel_source_hash, entries, pack.created)


def import_pack(session: Session, pack: Pack, *, source: str, host: str, user: str) -> int:
    """Write a checked pack's entries as trials and promote them; returns how many winners changed.

    Entries whose config already is the active winner (same fingerprint, backend, source hash and
    problem) are skipped, so importing a pack twice changes nothing the second time.
    """
    family = session.scalar(
        select(Kernel.family)
        .where(Kernel.backend == pack.backend, Kernel.source_hash == pack.kernel_source_hash)
        .order_by(Kernel.id)
        .limit(1)
    )
    sweep_id = None
    imported = 0
    for entry in pack.entries:
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
                status="done",
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
        trial_id = trials.record_trial(session, record)
        winners.promote(session, trial_id, reason=f"imported from {source}")
        imported += 1
    return imported
