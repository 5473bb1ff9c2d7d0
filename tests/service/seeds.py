"""A small database for the service's tests: one sweep of the xla backend on this machine's device, two
winners (one fresh, one tuned with an older kernel source, so stale), a failed trial, and a miss."""

from __future__ import annotations

import dataclasses

from moetune.db import open_store
from moetune.db.records import TrialRecord
from moetune.kernels.backends.xla import BACKEND, XlaConfig
from moetune.kernels.device import current_fingerprint
from moetune.kernels.problem import Problem

FP = current_fingerprint()
BASE = Problem(
    "grouped_matmul", m=512, k=32, n=16, g=4, lhs_dtype="float32", rhs_dtype="float32", out_dtype="float32"
)
FRESH = BASE  # tuned with the current kernel source
STALE = BASE.with_m(128)  # tuned with OLD_SOURCE
MISSED = BASE.with_m(64)
OLD_SOURCE = "0" * 16
SEGMENTS = XlaConfig(strategy="segments")
DENSE = XlaConfig(strategy="dense_masked")


@dataclasses.dataclass(frozen=True)
class Seeded:
    sweep_id: int
    trial_ids: tuple[int, ...]  # in the order written: fresh winner, stale winner, a failure


def record(problem: Problem, config: XlaConfig, *, sweep_id: int, source_hash: str, status: str = "ok"):
    median = 1e-3 if status == "ok" else None
    return TrialRecord(
        sweep_id=sweep_id,
        device=FP,
        backend="xla",
        family="xla",
        source_hash=source_hash,
        problem=problem,
        config=config.to_dict(),
        status=status,
        samples_s=(median, median) if median else (),
        median_s=median,
        error="" if status == "ok" else "boom",
    )


def seed(url: str) -> Seeded:
    with open_store(url) as store:
        sweep_id = store.create_sweep(backend="xla", strategy="grid", spec={}, host="h", user="u")
        current = BACKEND.source_hash()
        fresh = store.record_trial(record(FRESH, SEGMENTS, sweep_id=sweep_id, source_hash=current))
        stale = store.record_trial(record(STALE, DENSE, sweep_id=sweep_id, source_hash=OLD_SOURCE))
        failed = store.record_trial(
            record(FRESH, DENSE, sweep_id=sweep_id, source_hash=current, status="compile_error")
        )
        # The stale one first: a pack holds the kernel source of the newest promotion (db/pack_io.py).
        store.promote(stale, reason="fastest")
        store.promote(fresh, reason="fastest")
        store.finish_sweep(sweep_id, "done")
        store.record_miss(device=FP, backend="xla", problem=MISSED)
        store.record_miss(device=FP, backend="xla", problem=MISSED)
        store.record_miss(device=FP, backend="xla", problem=MISSED.with_m(32))
    return Seeded(sweep_id, (fresh, stale, failed))
