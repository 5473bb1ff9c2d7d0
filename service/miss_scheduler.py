"""Tune on miss: the problems dispatch missed most on each device kind become queued jobs (one problem, a
trial budget, for that device kind), so that a worker there tunes them and the next fetch serves the new
winners. A problem is left out while it has a fresh winner (found on that device fingerprint with the
backend's current kernel source: tuner/resolved.py) or a queued or running job of its own; at most `limit`
jobs are queued per device kind each time. A server started with `tune_misses` runs it every period.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Iterator
from typing import Any

from moetune.db.errors import DatabaseError
from moetune.kernels.errors import MoetuneError
from moetune.kernels.problem import Problem

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class MissPolicy:
    limit: int  # jobs queued per device kind per period
    budget: int | None = None  # trials per job (None: the backend's whole pruned space)
    period_s: float = 300.0


def problem_text(problem: Problem) -> str:
    """The problem as --problem spells it (tuner/plan.py parse_problem reads it back to the same key)."""
    return (
        f"op={problem.op},m={problem.m},k={problem.k},n={problem.n},g={problem.g},lhs={problem.lhs_dtype},"
        f"rhs={problem.rhs_dtype},out={problem.out_dtype},t={int(problem.transpose_rhs)}"
    )


def _pending(store: Any) -> set[tuple[str | None, str, str]]:
    """(device kind, backend, problem key) of every queued or running job's problems."""
    from moetune.tuner.plan import parse_problem

    pending = set()
    for job in store.jobs(states=("queued", "running")):
        for text in job.spec.get("problems", ()):
            with contextlib.suppress(MoetuneError):  # a job queued by an older moetune: not ours to judge
                pending.add((job.device_kind, job.spec.get("backend"), parse_problem(text).problem.key))
    return pending


def _source_hashes() -> Any:
    from moetune.kernels import registry

    known: dict[str, str | None] = {}

    def source_hash(backend: str) -> str | None:
        if backend not in known:
            try:
                known[backend] = registry.get(backend).source_hash()
            except Exception:  # not a backend of this server, or one whose dependency is missing here
                known[backend] = None
        return known[backend]

    return source_hash


def enqueue_misses(store: Any, policy: MissPolicy) -> list[int]:
    """Queue jobs for the most-missed problems of each device kind; the new jobs' ids."""
    from moetune.tuner import queue_spec
    from moetune.tuner.resolved import tuned
    from moetune.tuner.spec import SweepSpec

    pending, source_hash, queued = _pending(store), _source_hashes(), []
    per_kind: dict[str, int] = {}
    for miss in store.misses():  # most counted first
        kind, key = miss.device_kind, miss.problem.key
        if per_kind.get(kind, 0) >= policy.limit:
            continue
        if {(kind, miss.backend, key), (None, miss.backend, key)} & pending:
            continue
        current = source_hash(miss.backend)
        if current is None:
            continue
        where = dict(fingerprint_hash=miss.fingerprint_hash, backend=miss.backend, problem_key=key)
        if tuned(store, **where, source_hash=current):
            continue
        spec = SweepSpec(problems=(problem_text(miss.problem),), backend=miss.backend, budget=policy.budget)
        queued.append(
            store.submit_job(queue_spec.stored(spec), device_kind=kind, submitted_by="tune-on-miss")
        )
        pending.add((kind, miss.backend, key))
        per_kind[kind] = per_kind.get(kind, 0) + 1
    return queued


@contextlib.contextmanager
def running(store: Any, policy: MissPolicy) -> Iterator[None]:
    """enqueue_misses every policy.period_s from a daemon thread (a first pass at once) until the block
    ends; a database failure is logged and tried again next period."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                queued = enqueue_misses(store, policy)
                if queued:
                    log.info("tune on miss: queued jobs %s", ", ".join(map(str, queued)))
            except DatabaseError as e:
                log.warning("tune on miss: %s", e)
            stop.wait(policy.period_s)

    thread = threading.Thread(target=loop, name="moetune-tune-on-miss", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def running_for(store: Any, settings: Any) -> contextlib.AbstractContextManager[None]:
    """`running` as a server's settings (ServiceSettings) ask: nothing unless tune_misses is set."""
    if not settings.tune_misses:
        return contextlib.nullcontext()
    policy = MissPolicy(settings.tune_misses, settings.tune_misses_budget, settings.tune_misses_period_s)
    return running(store, policy)
