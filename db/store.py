"""Store: the one object the tuner, dispatch and the CLI use to reach the database.

Contract: every method runs in its own transaction (transaction.run) and has committed when it returns;
every failure of the database is a DatabaseError with one line that never shows the password; rows
returned are frozen dataclasses (moetune.db.records) that later writes never change. A Store is
thread-safe (one engine, a session per call). After a fork the child opens its own connections.

SQLite is fine for many processes on one machine (WAL, busy timeout, BEGIN IMMEDIATE, retries);
for many machines, or many hosts writing at once, use PostgreSQL.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import socket
import tempfile
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Self

from moetune.db import entities, jobs, leases, misses, pack_io, schema, transaction, trials, urls, winners
from moetune.db.engine import check_files, make_engine
from moetune.db.errors import DatabaseError, NoDatabase
from moetune.db.jobs import JobRow
from moetune.db.leases import Owner
from moetune.db.models import Device, Kernel, ProblemRow
from moetune.db.records import MissRow, SweepRow, TrialRecord, TrialRow, WinnerRow
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.packs import Pack
from moetune.kernels.problem import Problem


def open_store(url: str | None = None, *, check_schema: bool = True, read_only: bool = False) -> Store:
    """The store at url > $MOETUNE_DB > the default SQLite file.

    A fresh database is migrated to head; an older or unknown schema raises SchemaMismatch naming the
    fix. check_schema=False skips both (for `moetune db ...` and doctor, which handle any revision).

    read_only=True (commands that only read): nothing is ever created, migrated or written (engine.py);
    a database that does not exist yet, or has no moetune tables, raises NoDatabase.
    """
    store = Store(url, read_only=read_only)
    if check_schema:
        try:
            store.check_readable() if read_only else store.ensure_schema()
        except BaseException:
            store.close()
            raise
    return store


def schema_state_of(url: str | None) -> schema.SchemaState:
    """Where the database at `url` stands, read without creating or migrating anything."""
    probe = Store(url)
    try:
        return probe.schema_state()
    finally:
        probe.close()


@contextlib.contextmanager
def open_any_revision(url: str) -> Iterator[Store]:
    """A store that reads `url` whatever its schema revision, and changes nothing: a SQLite file of an
    older revision is copied into a temporary folder and the copy migrated to head (so the results
    databases kept beside the benchmarks stay as they were recorded); any other is opened read-only."""
    with open_store(url, check_schema=False, read_only=True) as probe:
        state = probe.schema_state()
    path = urls.sqlite_file(urls.parse(urls.resolve(url)))
    if state.status != "outdated" or path is None:
        with open_store(url, read_only=True) as store:
            yield store
        return
    import sqlite3

    with tempfile.TemporaryDirectory(prefix="moetune-copy-") as folder:
        copy = Path(folder) / path.name
        source = sqlite3.connect(f"file:{urllib.parse.quote(str(path))}?mode=ro", uri=True)
        target = sqlite3.connect(copy)
        try:
            source.backup(target)  # consistent, with whatever the source's -wal holds
        finally:
            target.close()
            source.close()
        with open_store(f"sqlite:///{copy}", check_schema=False) as store:
            store.upgrade()
            yield store


class Store:
    def __init__(self, url: str | None = None, *, read_only: bool = False) -> None:
        text = urls.resolve(url)
        self._url = urls.parse(text)
        # Only the default location's folder is created (on the first write); a typo in an explicit
        # path should fail rather than create folders.
        self._default_file = urls.sqlite_file(self._url) if text == urls.default_url() else None
        self._engine = make_engine(self._url, read_only=read_only)
        self._pid = os.getpid()
        self._ids = entities.KnownIds()
        # Seconds to keep trying when the connection is lost (a server restart): 0, fail at once, for a
        # command; the sweep driver sets it within its lease's grace (SweepDriver.run).
        self.reconnect_s = 0.0

    @property
    def shared(self) -> bool:
        """Whether other processes can reach this database (every one but in-memory SQLite)."""
        return self.dialect != "sqlite" or urls.sqlite_file(self._url) is not None

    @property
    def url(self) -> str:
        """The database URL with the password masked."""
        return urls.masked(self._url)

    @property
    def dialect(self) -> str:
        return self._url.get_backend_name()

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run[T](self, fn: Callable[..., T], *, write: bool) -> T:
        if os.getpid() != self._pid:  # forked: never share the parent's pooled connections
            self._engine.dispose(close=False)
            self._pid = os.getpid()
        return transaction.run(
            self._engine,
            self._url,
            fn,
            write=write,
            on_commit=self._ids.committed,
            reconnect_s=self.reconnect_s,
        )

    # --- schema -----------------------------------------------------------------------------------

    def schema_state(self) -> schema.SchemaState:
        return schema.inspect_database(self._engine, self._url)

    def revision(self) -> str | None:
        return self.schema_state().revision

    def ensure_schema(self) -> None:
        """Migrate a fresh database; raise SchemaMismatch for any other revision but head."""
        state = self.schema_state()
        # "unversioned" read without the lock may be a race, not a foreign database: on PostgreSQL each
        # statement of the read sees the latest commit, so another process's migration can land between
        # the version-table query and the table listing. Under the lock the read is consistent.
        if state.status in ("missing", "empty", "unversioned"):
            self._make_default_folder()
            state = schema.migrate(self._engine, self._url, only_if_empty=True)
        state.check()

    def checkpoint(self) -> None:
        """SQLite: copy what was committed to the -wal into the database file now, without waiting for
        anyone (PASSIVE); DatabaseError when the file cannot be written. SQLite's own checkpoints fail
        silently, and commits go on succeeding into the -wal alone: with the database file made
        immutable, a sweep would end well with all of its data in the -wal, whose index (-shm) then
        grows until the process dies of SIGBUS. Nothing to do for other databases."""
        if self.dialect != "sqlite" or not self.shared:
            return
        import sqlite3

        check_files(self._engine)  # no checkpoint into files that stopped taking writes (SIGBUS)
        connection = self._engine.raw_connection()  # outside any transaction: a checkpoint needs that
        try:
            connection.cursor().execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as e:
            raise DatabaseError(transaction.describe(e, self._url)) from e
        finally:
            connection.close()

    def check_readable(self) -> None:
        """NoDatabase for a database not created yet; SchemaMismatch for any revision but head."""
        state = self.schema_state()
        if not state.holds_tables:
            path = urls.sqlite_file(self._url)
            where = f"no database at {path}" if path is not None else f"no moetune tables in {self.url}"
            raise NoDatabase(f"{where}; run a sweep or moetune db upgrade first")
        state.check()

    def upgrade(self, target: str = "head") -> None:
        self._make_default_folder()
        schema.migrate(self._engine, self._url, target)

    def _make_default_folder(self) -> None:
        if self._default_file is not None:
            self._default_file.parent.mkdir(parents=True, exist_ok=True)

    def downgrade(self, target: str) -> None:
        self._ids.clear()
        schema.downgrade(self._engine, self._url, target)

    # --- devices, kernels, problems ---------------------------------------------------------------

    def ensure_device(self, fp: DeviceFingerprint) -> int:
        return self._run(lambda s: entities.ensure_device(s, fp), write=True)

    def ensure_kernel(self, backend: str, family: str, source_hash: str) -> int:
        return self._run(lambda s: entities.ensure_kernel(s, backend, family, source_hash), write=True)

    def ensure_problem(self, problem: Problem) -> int:
        return self._run(lambda s: entities.ensure_problem(s, problem), write=True)

    def device_kinds(self) -> list[str]:
        return self._run(lambda s: entities.known(s, Device.device_kind), write=False)

    def device(self, fingerprint_hash: str) -> DeviceFingerprint | None:
        """The device fingerprint a trial's `fingerprint_hash` names (None when none does)."""
        return self._run(lambda s: entities.device_of(s, fingerprint_hash), write=False)

    def backends(self) -> list[str]:
        return self._run(lambda s: entities.known(s, Kernel.backend), write=False)

    def has_problem(self, key: str) -> bool:
        return self._run(lambda s: entities.exists(s, ProblemRow.key, key), write=False)

    # --- sweeps and trials ------------------------------------------------------------------------

    def create_sweep(
        self,
        *,
        backend: str,
        strategy: str,
        spec: dict[str, Any],
        host: str,
        user: str,
        sweep_file: str | None = None,
        owner: Owner | None = None,
        device: DeviceFingerprint | None = None,
        force: bool = False,
    ) -> int:
        """A new running sweep. `owner`: its lease is taken (moetune.db.leases). `device`: the device a
        timing sweep times on, claimed at once; DeviceBusy (nothing written) while another live sweep
        times on it, unless `force`."""
        fields = dict(backend=backend, strategy=strategy, spec=spec, host=host, user=user)
        lease = dict(owner=owner, device=device, force=force, ids=self._ids)
        return self._run(
            lambda s: trials.create_sweep(s, sweep_file=sweep_file, **fields, **lease), write=True
        )

    def acquire_sweep(self, sweep_id: int, owner: Owner) -> None:
        """Take the lease of an existing sweep (to resume it); LeaseHeld while another process holds it."""
        self._run(lambda s: leases.acquire(s, sweep_id, owner), write=True)

    def claim_device(
        self, sweep_id: int, owner: Owner, device: DeviceFingerprint | None, *, force: bool = False
    ) -> None:
        """Mark `owner`'s sweep running on `device` (None: compile-only); DeviceBusy while another live
        sweep times on that device, unless `force`; LeaseLost when `owner` no longer holds the lease."""

        def claim(s: Any) -> None:
            device_id = None if device is None else self._ids.device(s, device)
            leases.claim_device(s, sweep_id, owner, device_id, force)

        self._run(claim, write=True)

    def heartbeat(self, sweep_id: int, owner: Owner) -> bool:
        """Move the lease's heartbeat; False when `owner` no longer holds it."""
        return self._run(lambda s: leases.heartbeat(s, sweep_id, owner), write=True)

    def release_sweep(self, sweep_id: int, owner: Owner) -> None:
        """Let go of the lease without finishing the sweep (its run never started)."""
        self._run(lambda s: leases.release(s, sweep_id, owner), write=True)

    def finish_sweep(self, sweep_id: int, status: str, *, owner: Owner | None = None) -> None:
        """Record the sweep's final status; with `owner`, LeaseLost (nothing written) when it no longer
        holds the lease."""
        self._run(lambda s: trials.finish_sweep(s, sweep_id, status, owner), write=True)

    def get_sweep(self, sweep_id: int) -> SweepRow:
        return self._run(lambda s: trials.get_sweep(s, sweep_id), write=False)

    def sweeps(self, *, limit: int | None = None) -> list[SweepRow]:
        """Sweeps, newest first."""
        return self._run(lambda s: trials.sweeps(s, limit=limit), write=False)

    def record_trial(self, rec: TrialRecord, *, owner: Owner | None = None) -> int:
        """Write one finished trial; committed (durable) when this returns. With `owner`, LeaseLost (nothing
        written) when it no longer holds the lease of the trial's sweep."""
        return self._run(lambda s: trials.record_trial(s, rec, self._ids, owner), write=True)

    def trials(
        self,
        *,
        sweep_id: int | None = None,
        backend: str | None = None,
        status: str | None = None,
        device_kind: str | None = None,
        problem_key: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[TrialRow]:
        """Matching trials, newest first; `offset` skips that many of the newest."""
        filters = dict(
            sweep_id=sweep_id,
            backend=backend,
            status=status,
            device_kind=device_kind,
            problem_key=problem_key,
            limit=limit,
            offset=offset,
        )
        return self._run(lambda s: trials.trials(s, **filters), write=False)

    def done_configs(
        self, *, fingerprint_hash: str, backend: str, source_hash: str, problem_key: str
    ) -> dict[str, TrialRow]:
        """Recorded trials keyed by canonical config JSON (records.canonical_config); latest per config."""
        key = dict(
            fingerprint_hash=fingerprint_hash,
            backend=backend,
            source_hash=source_hash,
            problem_key=problem_key,
        )
        return self._run(lambda s: trials.done_configs(s, **key), write=False)

    # --- winners ----------------------------------------------------------------------------------

    def promote(self, trial_id: int, *, reason: str = "", decision: dict[str, Any] | None = None) -> int:
        """Make an ok trial the active winner of its key; the previous winner stays, superseded.
        `decision`: how it was decided (plain JSON data, kept with the winner)."""
        return self._run(lambda s: winners.promote(s, trial_id, reason, decision), write=True)

    def current_winner(self, *, fingerprint_hash: str, backend: str, problem_key: str) -> WinnerRow | None:
        key = dict(fingerprint_hash=fingerprint_hash, backend=backend, problem_key=problem_key)
        return self._run(lambda s: winners.current_winner(s, **key), write=False)

    def winners(
        self,
        *,
        device_kind: str | None = None,
        backend: str | None = None,
        shape_key: str | None = None,
        m: int | None = None,
        k: int | None = None,
        n: int | None = None,
        g: int | None = None,
        active_only: bool = True,
        fingerprint_hash: str | None = None,
        problem_key: str | None = None,
    ) -> list[WinnerRow]:
        filters = dict(
            device_kind=device_kind,
            backend=backend,
            shape_key=shape_key,
            m=m,
            k=k,
            n=n,
            g=g,
            active_only=active_only,
            fingerprint_hash=fingerprint_hash,
            problem_key=problem_key,
        )
        return self._run(lambda s: winners.winners(s, **filters), write=False)

    def rollback(
        self,
        *,
        backend: str,
        problem_key: str,
        fingerprint_hash: str | None = None,
        device_kind: str | None = None,
    ) -> WinnerRow:
        """Withdraw the active winner and restore the one before it; InvalidRecord if there is none."""
        key = dict(
            backend=backend,
            problem_key=problem_key,
            fingerprint_hash=fingerprint_hash,
            device_kind=device_kind,
        )
        return self._run(lambda s: winners.rollback(s, **key), write=True)

    # --- misses -----------------------------------------------------------------------------------

    def record_miss(self, *, device: DeviceFingerprint, backend: str, problem: Problem) -> None:
        self._run(
            lambda s: misses.record_miss(s, device=device, backend=backend, problem=problem, ids=self._ids),
            write=True,
        )

    def record_misses(self, counted: Mapping[tuple[DeviceFingerprint, str, Problem], int]) -> None:
        """Count many misses in one transaction: (device, backend, problem) -> how many times."""
        self._run(lambda s: misses.record_misses(s, counted, self._ids), write=True)

    def misses(self, *, device_kind: str | None = None, backend: str | None = None) -> list[MissRow]:
        return self._run(lambda s: misses.misses(s, device_kind=device_kind, backend=backend), write=False)

    # --- the tuning queue (moetune.db.jobs) -------------------------------------------------------

    def submit_job(
        self,
        spec: dict[str, Any],
        *,
        sweep_file: str | None = None,
        device_kind: str | None = None,
        priority: int = 0,
        submitted_by: str = "",
    ) -> int:
        """A queued job running `spec` (a SweepSpec's dict, without its database URL)."""
        fields = dict(sweep_file=sweep_file, device_kind=device_kind, priority=priority)
        return self._run(lambda s: jobs.submit(s, spec=spec, submitted_by=submitted_by, **fields), write=True)

    def claim_job(self, owner: Owner, *, device_kind: str | None = None) -> JobRow | None:
        """The next queued job that fits `device_kind`, now running under `owner`; None if none."""
        return self._run(lambda s: jobs.claim_next(s, owner, device_kind), write=True)

    def heartbeat_job(self, job_id: int, owner: Owner) -> bool:
        return self._run(lambda s: jobs.heartbeat(s, job_id, owner), write=True)

    def set_job_sweep(self, job_id: int, owner: Owner, sweep_id: int) -> bool:
        return self._run(lambda s: jobs.set_sweep(s, job_id, owner, sweep_id), write=True)

    def finish_job(self, job_id: int, owner: Owner, state: str, error: str | None = None) -> bool:
        return self._run(lambda s: jobs.finish(s, job_id, owner, state, error), write=True)

    def release_job(self, job_id: int, owner: Owner) -> bool:
        return self._run(lambda s: jobs.release(s, job_id, owner), write=True)

    def cancel_job(self, job_id: int) -> JobRow:
        return self._run(lambda s: jobs.cancel(s, job_id), write=True)

    def requeue_stale_jobs(self) -> list[int]:
        return self._run(jobs.requeue_stale, write=True)

    def get_job(self, job_id: int) -> JobRow:
        return self._run(lambda s: jobs.get_job(s, job_id), write=False)

    def jobs(self, *, states: tuple[str, ...] = (), limit: int | None = None) -> list[JobRow]:
        """Jobs, newest first."""
        return self._run(lambda s: jobs.jobs(s, states=states, limit=limit), write=False)

    # --- live progress (moetune.db.progress) ---------------------------------------------------------

    def publish_progress(self, sweep_id: int, progress: dict[str, Any]) -> None:
        """Replace the sweep's published progress (a small JSON object), stamped with the database's clock."""
        from moetune.db import progress as live

        self._run(lambda s: live.publish(s, sweep_id, progress), write=True)

    def sweep_progress(self, sweep_id: int) -> tuple[dict[str, Any] | None, float | None]:
        """(the sweep's last published progress, its age in seconds), (None, None) before any."""
        from moetune.db import progress as live

        return self._run(lambda s: live.read(s, sweep_id), write=False)

    def append_job_log(self, job_id: int, lines: list[str]) -> None:
        """Add lines to the job's log; only its newest progress.JOB_LOG_LINES are kept."""
        from moetune.db import progress as live

        self._run(lambda s: live.append_lines(s, job_id, lines), write=True)

    def job_log(self, job_id: int, *, limit: int | None = None) -> list[tuple[Any, str]]:
        """The job's newest log lines (at most `limit`), oldest first, each with when it was written."""
        from moetune.db import progress as live

        return self._run(lambda s: live.lines(s, job_id, limit or live.JOB_LOG_LINES), write=False)

    # --- config packs -----------------------------------------------------------------------------

    def export_pack(self, *, device_kind: str, backend: str) -> Pack:
        return self._run(
            lambda s: pack_io.export_pack(s, device_kind=device_kind, backend=backend), write=False
        )

    def import_pack(self, pack: Pack, *, source: str = "<pack>", checked: bool = False) -> int:
        """Check the whole pack first (PackInvalid, nothing written), then import it a chunk of entries
        per transaction, so that other writers get the lock in between (pack_io.import_pack).
        `checked`: `pack` is already pack_io.check_pack's result (a caller that checks before it opens
        the database), so it is not checked twice (seconds for a pack of a few hundred entries)."""
        checked = pack if checked else pack_io.check_pack(pack, source)
        return pack_io.import_pack(
            lambda fn: self._run(fn, write=True),
            checked,
            source=source,
            host=socket.gethostname(),
            user=_user(),
            ids=self._ids,
            pause_s=pack_io.chunk_pause_s(self.dialect),
        )


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers)
        return ""
