"""Winners as `moetune best` lists them: a database winner (with its row) or a config pack's entry, each
with the time that decided it (tuner/decided.py) and whether it is fresh on this machine (Stack)."""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

from moetune.tuner.decided import WinnerView
from moetune.tuner.listings.source_hashes import SourceHashes
from moetune.tuner.listings.tokens import SweepTokens

if TYPE_CHECKING:
    from moetune.db.records import WinnerRow
    from moetune.kernels.device import DeviceFingerprint
    from moetune.kernels.lookup import Winner

FRESH, STALE, OTHER_DEVICE, UNKNOWN = "fresh", "stale", "other device", "unknown"


@dataclasses.dataclass(frozen=True)
class Listed:
    """One listed winner: a database winner (with its `row`) or an entry of a config pack."""

    device_kind: str
    winner: Winner
    origin: str  # "database", or the pack's file name
    reason: str
    row: WinnerRow | None = None
    freshness: str = ""  # FRESH | STALE | OTHER_DEVICE | UNKNOWN: see Stack.freshness
    stale: tuple[str, ...] = ()
    tokens: int | None = None  # T, as the sweep that tuned it recorded it

    @property
    def view(self) -> WinnerView:
        """Its time as decided: a database winner's stored decision, else its recorded median."""
        row = self.row
        decisions = (row.decision,) if row is not None else ()
        trial_id = row.trial_id if row is not None else -1
        return WinnerView.of(trial_id, self.winner.config, self.winner.median_s, decisions)

    @property
    def order(self) -> tuple[str, str, str, int, bool]:
        p = self.winner.problem
        return self.device_kind, self.winner.backend, p.shape_key, p.m, self.row is None


class Stack:
    """This machine's device fingerprint and kernel sources: what makes a winner fresh or stale here."""

    def __init__(self) -> None:
        from moetune.kernels.device import current_fingerprint

        # Reading the fingerprint opens the device; a listing must not reserve most of a GPU's memory.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        try:
            self.device: DeviceFingerprint | None = current_fingerprint()
        except Exception:  # no usable device (a broken driver, say): rows list with freshness unknown
            self.device = None
        self.source_hash = SourceHashes()

    def freshness(self, listed: Listed) -> Listed:
        """fresh: tuned on this device with this kernel source; stale: either differs (with why); other
        device: the kernel source is current, the device is not this machine's; unknown: no way to tell."""
        from moetune.kernels.lookup import stale_reasons

        here = self.device is not None and self.device.device_kind == listed.device_kind
        source_hash = self.source_hash(listed.winner.backend)
        stale = stale_reasons(listed.winner, self.device.hash if here else None, source_hash)
        if stale:
            verdict = STALE
        elif source_hash is None:
            verdict = UNKNOWN
        else:
            verdict = FRESH if here else OTHER_DEVICE
        return dataclasses.replace(listed, freshness=verdict, stale=stale)

    def judged(self, listed: list[Listed]) -> list[Listed]:
        """Each with its freshness, in `best`'s order."""
        return sorted((self.freshness(item) for item in listed), key=lambda item: item.order)


def database_winners(store: Any, **filters: Any) -> list[Listed]:
    """The store's winners matching `filters` (Store.winners' keywords), not yet judged fresh or stale."""
    from moetune.kernels.lookup import db_winner

    tokens = SweepTokens(store)
    return [
        Listed(
            r.device_kind, db_winner(r), "database", r.reason, row=r, tokens=tokens(r.sweep_id, r.problem.key)
        )
        for r in store.winners(**filters)
    ]


def winner_dict(listed: Listed) -> dict[str, Any]:
    w, row = listed.winner, listed.row
    view = listed.view
    return {
        "id": row.id if row else None,
        "trial_id": row.trial_id if row else None,
        "device_kind": listed.device_kind,
        "fingerprint_hash": w.fingerprint_hash,
        "backend": w.backend,
        "source_hash": w.source_hash,
        "problem": w.problem.to_dict() | {"key": w.problem.key},
        "tokens": listed.tokens,
        "config": dict(w.config),
        "median_s": w.median_s,
        "decided": view.time.to_dict(),
        "decision": view.decision,
        "promoted_at": row.promoted_at if row else None,
        "state": row.state if row else "active",
        "reason": listed.reason,
        "origin": listed.origin,
        "freshness": listed.freshness,
        "stale": list(listed.stale),
    }
