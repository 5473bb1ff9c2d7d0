"""One claimed job run to its end as `moetune tune` runs a sweep (the same code: sweep_run.run_sweep), by the
worker that claimed it (`moetune worker`).

A job's first run creates its sweep and records the sweep's id in the job at once; a later run (the job was
requeued because its worker died or stopped) resumes that sweep as `moetune tune --resume` does, so no
finished trial is repeated and none is lost. While it runs, a thread moves the job's heartbeat; when the job
is no longer this worker's (cancelled, or requeued after this worker was silent too long) the thread
interrupts the sweep, which is then left as it is: resumable, and no longer this worker's to write.
"""

from __future__ import annotations

import _thread
import dataclasses
import threading

import typer

from moetune.db import jobs
from moetune.db.errors import DatabaseError, LeaseHeld
from moetune.db.jobs import JobRow
from moetune.db.leases import Owner
from moetune.kernels.errors import MoetuneError
from moetune.tuner import queue_spec
from moetune.tuner.sweep_run import EXIT_INCOMPLETE, EXIT_STOPPED
from moetune.tuner.sweep_setup import NothingToTune, load_sweep

# tune's exit codes (tuner/sweep_run.py) as what became of the job.
_EXIT_REASONS = {
    EXIT_INCOMPLETE: "incomplete (re-timing failed twice)",
    EXIT_STOPPED: "stopped (database failure or lease lost)",
}


@dataclasses.dataclass(frozen=True)
class Ran:
    """How a run ended: `state` written to the job (done, failed), or None when the job went back to the
    queue or is no longer this worker's; `stop`: the worker should stop (SIGTERM); `held`: the job's sweep
    is still held by its last process (not stale yet), so claiming the job again at once would be refused."""

    state: str | None
    error: str | None = None
    stop: bool = False
    held: bool = False


class _JobHeartbeat:
    """Moves the job's heartbeat every jobs.heartbeat_s() from a daemon thread; the first time the job is
    not this owner's any more, interrupts the main thread (the sweep stops as on Ctrl-C)."""

    def __init__(self, store, job_id: int, owner: Owner) -> None:
        self.lost = False
        self._store, self._job_id, self._owner = store, job_id, owner
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="moetune-job-heartbeat", daemon=True)

    def __enter__(self) -> _JobHeartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=jobs.heartbeat_s())

    def _loop(self) -> None:
        while not self._stop.wait(jobs.heartbeat_s()):
            try:
                held = self._store.heartbeat_job(self._job_id, self._owner)
            except DatabaseError:
                continue  # the database may come back before the grace period ends
            if not held:
                self.lost = True
                if not self._stop.is_set():
                    _thread.interrupt_main()
                return


def run_job(
    store,
    job: JobRow,
    owner: Owner,
    *,
    db: str | None,
    ray_address: str | None,
    inline: bool,
    as_json: bool = False,
    stop: threading.Event | None = None,
) -> Ran:
    """Run `job` (claimed by `owner`) on this worker's database and cluster. Once `stop` is set (SIGTERM)
    the candidates in flight are finished and recorded, and the job goes back to the queue; so it does on
    KeyboardInterrupt, at once. Its output (stderr) and how it ended go to the job's log in the database
    (tuner/job_log.py)."""
    from moetune.tuner.job_log import JobLog

    log = JobLog(store, job.id)
    with log.capturing():
        again = f", resuming sweep {job.sweep_id}" if job.sweep_id is not None else ""
        log.line(f"claimed by {owner.host}:{owner.pid} (attempt {job.attempts}){again}")
        ran = _run_job(
            store, job, owner, db=db, ray_address=ray_address, inline=inline, as_json=as_json, stop=stop
        )
        if ran.state is not None:
            log.line(f"{ran.state}" + (f": {ran.error}" if ran.error else ""))
        elif ran.stop:
            log.line("stopped by its worker; back in the queue")
        elif ran.held:
            log.line("its sweep is still held by its last process; back in the queue")
        else:
            log.line("no longer this worker's (cancelled, or requeued)")
    return ran


def _run_job(
    store,
    job: JobRow,
    owner: Owner,
    *,
    db: str | None,
    ray_address: str | None,
    inline: bool,
    as_json: bool,
    stop: threading.Event | None,
) -> Ran:
    from moetune.tuner import sweep_run

    where = dict(db=db, ray_address=ray_address)
    heartbeat = _JobHeartbeat(store, job.id, owner)
    try:
        with heartbeat:
            if job.sweep_id is None:
                spec, planned, sweep_file = queue_spec.of_job(job).override(**where), None, job.sweep_file
            elif store.get_sweep(job.sweep_id).stored_status == "done":
                return Ran("done")  # its last worker died between finishing the sweep and the job
            else:
                spec, planned = load_sweep(store, job.sweep_id)
                spec, sweep_file = spec.override(**where), None
            sweep_run.run_sweep(
                spec,
                planned,
                resume_id=job.sweep_id,
                sweep_file=sweep_file,
                dry_run=False,
                inline=inline,
                as_json=as_json,
                force=False,
                on_sweep=lambda sweep_id: store.set_job_sweep(job.id, owner, sweep_id),
                stop=stop,
            )
        return Ran("done")
    except (KeyboardInterrupt, typer.Exit) as e:
        if heartbeat.lost:
            return Ran(None)  # cancelled, or requeued: the job is not ours to write
        if isinstance(e, KeyboardInterrupt) or e.exit_code == 130:
            store.release_job(job.id, owner)
            return Ran(None, stop=True)
        sweep = store.get_job(job.id).sweep_id
        return Ran("failed", f"sweep {sweep}: {_EXIT_REASONS.get(e.exit_code, f'exit code {e.exit_code}')}")
    except NothingToTune as e:  # --misses / --stale found every winner current: the job has nothing to do
        return Ran("done", str(e))
    except LeaseHeld:  # the sweep's last process is silent but not yet stale: a later claim resumes it
        store.release_job(job.id, owner)
        return Ran(None, held=True)
    except MoetuneError as e:
        return Ran("failed", str(e))
    except Exception as e:  # a bug met by one job must not stop the worker from running the next
        return Ran("failed", f"{type(e).__name__}: {e}")
