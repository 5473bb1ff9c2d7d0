"""GET /metrics: the service's state in Prometheus' text format, for Grafana (scrape it every 15-60 s).

    moetune_jobs{state}                    jobs per state (queued: the queue's depth)
    moetune_jobs_stale                     running jobs whose worker stopped heartbeating
    moetune_sweeps{status}                 sweeps per status as shown (running, dead, done, ...)
    moetune_trials_total{status}           trials recorded, per status
    moetune_trials_last_minute             trials recorded in the last 60 s (each is written when it ends)
    moetune_winners_active                 active winners
    moetune_misses_total                   dispatch misses counted
    moetune_missed_problems                distinct (device, backend, problem) misses

Each scrape reads the database afresh: a few aggregate queries (counts grouped by a column), the same on
SQLite and PostgreSQL. The numbers come from the database, not from this process, so several server
processes over one database report the same values. prometheus_client renders the text; without it the
route answers 404 naming the package.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import Response
from sqlalchemy import func, select
from starlette.concurrency import run_in_threadpool

from moetune.db import leases
from moetune.db.jobs import JOB_STATES
from moetune.db.models import Job, Miss, Sweep, Trial, Winner
from moetune.service.auth import require_read

router = APIRouter(tags=["service"], dependencies=[Depends(require_read)])


def read_counts(store: Any) -> dict[str, Any]:
    """Every number /metrics shows, from one read transaction."""

    def read(session: Any) -> dict[str, Any]:
        now = leases.db_now(session)
        jobs = dict(session.execute(select(Job.state, func.count()).group_by(Job.state)).all())
        stale = sum(
            leases.is_stale(host, pid, None if beat is None else (now - beat).total_seconds())
            for host, pid, beat in session.execute(
                select(Job.owner_host, Job.owner_pid, Job.heartbeat_at).where(Job.state == "running")
            )
        )
        sweeps: dict[str, int] = {}
        running = select(Sweep.status, Sweep.owner_host, Sweep.owner_pid, Sweep.heartbeat_at)
        for status, host, pid, beat in session.execute(running.where(Sweep.status == "running")):
            age = None if beat is None else (now - beat).total_seconds()
            shown = leases.shown_status(status, host, pid, age)
            sweeps[shown] = sweeps.get(shown, 0) + 1
        ended = select(Sweep.status, func.count()).where(Sweep.status != "running").group_by(Sweep.status)
        sweeps |= dict(session.execute(ended).all())
        trials = dict(session.execute(select(Trial.status, func.count()).group_by(Trial.status)).all())
        minute_ago = now - datetime.timedelta(seconds=60)
        last_minute = session.scalar(select(func.count()).where(Trial.created_at >= minute_ago))
        misses, missed = session.execute(select(func.coalesce(func.sum(Miss.count), 0), func.count())).one()
        winners = session.scalar(select(func.count()).select_from(Winner).where(Winner.state == "active"))
        return dict(
            jobs={state: jobs.get(state, 0) for state in JOB_STATES},
            jobs_stale=stale,
            sweeps=sweeps,
            trials=trials,
            trials_last_minute=last_minute or 0,
            winners_active=winners or 0,
            misses=int(misses),
            missed_problems=missed,
        )

    # Store._run: a read transaction with the store's error mapping (a database that does not answer is
    # the service's 503), as every Store method uses it.
    return store._run(read, write=False)


class _Collector:
    """A prometheus_client collector over one read of the database."""

    def __init__(self, counts: dict[str, Any]) -> None:
        self.counts = counts

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        c = self.counts
        help_text = "Jobs per state (queued: the queue depth)."
        jobs = GaugeMetricFamily("moetune_jobs", help_text, labels=["state"])
        for state, n in c["jobs"].items():
            jobs.add_metric([state], n)
        yield jobs
        yield GaugeMetricFamily(
            "moetune_jobs_stale", "Running jobs whose worker stopped heartbeating.", value=c["jobs_stale"]
        )
        sweeps = GaugeMetricFamily("moetune_sweeps", "Sweeps per status as shown.", labels=["status"])
        for status in sorted({"running", *c["sweeps"]}):
            sweeps.add_metric([status], c["sweeps"].get(status, 0))
        yield sweeps
        trials = CounterMetricFamily("moetune_trials", "Trials recorded, per status.", labels=["status"])
        for status, n in sorted(c["trials"].items()):
            trials.add_metric([status], n)
        yield trials
        yield GaugeMetricFamily(
            "moetune_trials_last_minute", "Trials finished in the last 60 s.", value=c["trials_last_minute"]
        )
        yield GaugeMetricFamily("moetune_winners_active", "Active winners.", value=c["winners_active"])
        yield CounterMetricFamily("moetune_misses", "Dispatch misses counted.", value=c["misses"])
        missed = "Distinct (device, backend, problem) misses."
        yield GaugeMetricFamily("moetune_missed_problems", missed, value=c["missed_problems"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format 0.0.4."}},
)
async def metrics(request: Request) -> Response:
    """The service's state in Prometheus' text format: queue depth, running sweeps, trials per minute,
    misses, active winners."""
    try:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    except ImportError:
        raise HTTPException(404, "/metrics needs the prometheus-client package") from None
    counts = await run_in_threadpool(read_counts, request.app.state.store)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(counts))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
