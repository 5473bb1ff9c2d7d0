"""The driver's progress, published to the database as it goes, for the dashboard (and anyone reading
the sweep's row): Published wraps the display the driver was given and, beside it, writes the snapshot's
figures into the sweep's row (moetune.db.progress) at start, at most every PUBLISH_S, and at the end.

A publication is a few kB of JSON (the first MAX_ROWS problems); one that fails (the database is busy or
gone for a moment) is logged once and skipped: progress is for people, and the sweep's own writes (its
trials, its heartbeat) are what decide whether it goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from moetune.db.errors import DatabaseError
from moetune.tuner.progress import Progress, Snapshot
from moetune.tuner.summary import live_cells

log = logging.getLogger(__name__)

PUBLISH_S = 2.0
MAX_ROWS = 200  # problems and best-so-far rows published; the rest are counted


def as_json(s: Snapshot, *, final: bool = False) -> dict[str, Any]:
    """The snapshot's figures as plain JSON: what the dashboard shows of a running sweep."""
    ok = s.counts.get("ok", 0)
    return {
        "final": final,
        "stage": s.stage,
        "elapsed_s": round(s.elapsed_s, 1),
        "planned": s.planned,
        "done": s.done,
        "ok": ok,
        "failed": s.done - ok,
        "counts": dict(s.counts),
        "recorded": s.recorded,
        "rate_per_min": round(s.rate_per_min, 2),
        "eta_s": None if s.eta_s is None else round(s.eta_s, 1),
        "workers": s.workers,
        "lanes": dict(s.lanes),
        "setup": dict(s.setup),
        "problems": [
            {"label": p.label, "done": p.done, "planned": p.planned, "phase": p.phase}
            for p in s.problems[:MAX_ROWS]
        ],
        "best": live_cells(s.best[:MAX_ROWS]),
        "more_rows": max(0, len(s.problems) - MAX_ROWS, len(s.best) - MAX_ROWS),
    }


class Published(Progress):
    """`inner`'s display, and the same snapshots published to the sweep's row."""

    def __init__(
        self,
        inner: Progress,
        store: Any,
        sweep_id: int,
        *,
        every_s: float = PUBLISH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner, self.store, self.sweep_id = inner, store, sweep_id
        self.every_s, self.clock = every_s, clock
        self._last = -float("inf")
        self._warned = False

    def start(self, snapshot: Snapshot) -> None:
        self.inner.start(snapshot)
        self._publish(snapshot)

    def update(self, snapshot: Snapshot) -> None:
        self.inner.update(snapshot)
        if self.clock() - self._last >= self.every_s:
            self._publish(snapshot)

    def close(self, snapshot: Snapshot) -> None:
        self.inner.close(snapshot)
        self._publish(snapshot, final=True)

    def abandon(self) -> None:
        self.inner.abandon()

    def _publish(self, snapshot: Snapshot, *, final: bool = False) -> None:
        self._last = self.clock()
        try:
            self.store.publish_progress(self.sweep_id, as_json(snapshot, final=final))
        except DatabaseError as e:
            if not self._warned:
                self._warned = True
                log.warning(
                    "moetune: sweep %s: cannot publish its progress (%s); the sweep goes on", self.sweep_id, e
                )
