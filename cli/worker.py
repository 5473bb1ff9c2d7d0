"""`moetune worker`: run the tuning queue's jobs (moetune.db.jobs), one at a time, as `moetune tune` runs
sweeps: claim the best job that fits, run it (resuming its sweep when an earlier worker started it), finish
it, claim the next. Before each claim, jobs whose worker died are put back in the queue.

SIGTERM stops the worker: the running job's candidates in flight are finished and recorded, its sweep
stops as an interrupted `tune` does, and the job goes back to the queue for the next worker to resume.
A second SIGTERM, or Ctrl-C, stops at once (what was in flight is run again by the next worker).
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Annotated

import typer

from moetune.cli import app
from moetune.cli.common import DbOption, err_console, fail
from moetune.tuner.sweep_run import EXIT_STOPPED  # as tune's: the database failed

# Seconds between looks at an empty queue.
POLL_S = 2.0


def _say(message: str) -> None:
    err_console.print(message, markup=False, highlight=False, soft_wrap=True)


def _report(store, job_id: int, owner, ran) -> None:
    """Write the job's end (done or failed) and say what became of it. A database failure here leaves the
    job running under this worker, which stops heartbeating it: it goes stale, and the next claim finds
    its sweep done and finishes it."""
    from moetune.db.errors import DatabaseError

    if ran.state is not None:
        try:
            finished = store.finish_job(job_id, owner, ran.state, ran.error)
        except DatabaseError as e:
            _say(f"job {job_id}: {ran.state}, but not recorded ({e})")
            return
        if finished:
            _say(f"job {job_id}: {ran.state}" + (f" ({ran.error})" if ran.error else ""))
            return
    if ran.stop:
        _say(f"job {job_id}: back in the queue; this worker stops")
    elif ran.held:
        _say(f"job {job_id}: its sweep is still held by its last process; back in the queue")
        time.sleep(POLL_S)  # not claimed again at once: the lease goes stale in its own time
    else:
        _say(f"job {job_id}: no longer this worker's (cancelled or requeued)")


@app.command()
def worker(
    db: DbOption = None,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address", help="Join this Ray cluster.", show_default="start a local one per job"
        ),
    ] = None,
    device_kind: Annotated[
        str | None,
        typer.Option(
            "--device-kind",
            help="The device kind this worker's cluster times on: it also takes the jobs that target it.",
            show_default="only jobs for any device",
        ),
    ] = None,
    once: Annotated[
        bool, typer.Option("--once", help="Exit once the queue has no job for this worker.")
    ] = False,
    inline: Annotated[
        bool, typer.Option("--inline", help="No Ray: compile and time one by one in this process.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print each job's sweep outcome as JSON, as `tune --json` does.")
    ] = False,
) -> None:
    """Run queued jobs until stopped (SIGTERM; the running job goes back to the queue), or with --once
    until the queue is empty. Progress on stderr, as `moetune tune` shows it."""
    from moetune.db import jobs, open_store
    from moetune.db.errors import DatabaseError
    from moetune.db.leases import Owner
    from moetune.kernels.errors import MoetuneError
    from moetune.tuner.job_runner import run_job

    if device_kind is not None and (not device_kind.strip() or not device_kind.isprintable()):
        # An empty kind would match no job's device and, stored with a claim, name no device.
        fail(f"--device-kind {device_kind!r}: give a device kind as jax names it, e.g. 'NVIDIA H200'")
    try:
        jobs.grace_s(), jobs.heartbeat_s()  # a bad $MOETUNE_JOB_* fails now, in one line
        if once:  # a database not created holds no jobs: nothing to create it for
            from moetune.cli.db_commands import refuse_missing_database

            refuse_missing_database(db)
        store = open_store(db)
    except MoetuneError as e:
        fail(str(e))

    stopping, running = threading.Event(), threading.Event()

    def stop(signum: int, _frame: object) -> None:
        if running.is_set() and not stopping.is_set():
            stopping.set()
            _say("stopping: finishing the candidates in flight (SIGTERM again: at once)")
            return
        raise KeyboardInterrupt  # idle, or asked twice: as Ctrl-C

    def claim(owner: Owner):
        for job_id in store.requeue_stale_jobs():
            _say(f"job {job_id}: its worker stopped; back in the queue")
        return store.claim_job(owner, device_kind=device_kind)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        while True:
            owner = Owner.here()
            try:
                job = claim(owner)
            except DatabaseError as e:
                if once:
                    err_console.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
                    raise typer.Exit(EXIT_STOPPED) from None
                _say(f"error: {e}; trying again in {POLL_S:.0f} s")
                time.sleep(POLL_S)
                continue
            if job is None:
                if once:
                    _say("the queue is empty")
                    return
                time.sleep(POLL_S)
                continue
            resuming = f", resuming sweep {job.sweep_id}" if job.sweep_id else ""
            _say(f"job {job.id}: claimed by {owner} (attempt {job.attempts}{resuming})")
            running.set()
            try:
                ran = run_job(
                    store,
                    job,
                    owner,
                    db=db,
                    ray_address=ray_address,
                    inline=inline,
                    as_json=as_json,
                    stop=stopping,
                )
            finally:
                running.clear()
            _report(store, job.id, owner, ran)
            if ran.stop or stopping.is_set():
                return
    except KeyboardInterrupt:
        _say("worker stopped")
    finally:
        signal.signal(signal.SIGTERM, previous)
        store.close()
