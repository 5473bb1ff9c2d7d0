"""Whether a problem is tuned on a device: an active winner for that device fingerprint, backend and
problem, found with the backend's current kernel source. `moetune tune --misses` and `--stale` leave
such problems out, and `moetune misses` shows such a miss as resolved: one test for both."""

from __future__ import annotations

from typing import Any


def tuned(
    store: Any, *, fingerprint_hash: str, backend: str, source_hash: str | None, problem_key: str
) -> bool:
    winner = store.current_winner(fingerprint_hash=fingerprint_hash, backend=backend, problem_key=problem_key)
    return winner is not None and source_hash is not None and winner.source_hash == source_hash
