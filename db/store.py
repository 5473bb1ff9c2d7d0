"""Store: the one object the tuner, dispatch and the CLI use to reach the database.

Contract: every method runs in its own transaction (transaction.run) and has committed when it returns;
every failure of the database is a DatabaseError with one line that never shows the password; rows
returned are frozen dataclasses (moetune.db.records) that later writes never change. A Store is
thread-safe (one engine, a session per call). After a fork the child opens its own connections.

SQLite is fine for many processes on one machine (WAL, busy timeout, BEGIN IMMEDIATE, retries);
for many machines, or many hosts writing at once, use PostgreSQL.
"""

from __future__ import annotations

import getpass
import os
import socket
from collections.abc import Callable
from typing import Any, Self

from moetune.db import entities, misses, pack_io, schema, transaction, trials, urls, winners
from moetune.db.engine import make_engine
from moetune.db.models import Device, Kernel, ProblemRow
from moetune.db.records import MissRow, SweepRow, TrialRecord, TrialRow, WinnerRow
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.packs import Pack
from moetune.kernels.problem import Problem


def open_store(url: str | None = None, *, check_schema: bool = True) -> Store:
    """The store at url > $MOETUNE_DB > the default SQLite file.

    A fresh database is migrated to head; an older or unknown schema raises SchemaMismatch naming the
    fix. check_schema=False skips both (for `moetune db ...` and doctor, which handle any revision).
    """
    store = Store(url)
    if check_schema:
        try:
            store.ensure_schema()
        except BaseException:
            store.close()
            raise
    return store


class Store:
    def __init__(self, url: str | None = None) -> None:
        text = urls.resolve(url)
        self._url = urls.parse(text)
        # Only the default location's folder is created (on the first write); a typo in an explicit
        # path should fail rather than create folders.
        self._default_file = urls.sqlite_file(self._url) if text == urls.default_url() else None
        self._engine = make_engine(self._url)
        self._pid = os.getpid()
        self._ids = entities.KnownIds()

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
        return transaction.run(self._engine, self._url, fn, write=write, on_commit=self._ids.committed)

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
    ) -> int:
        def create(s: Any) -> int:
            return trials.create_sweep(
                s, backend=backend, strategy=strategy, spec=spec, host=host, user=user, sweep_file=sweep_file
            )

        return self._run(create, write=True)

    def finish_sweep(self, sweep_id: int, status: str) -> None:
        self._run(lambda s: trials.finish_sweep(s, sweep_id, status), write=True)

    def get_sweep(self, sweep_id: int) -> SweepRow:
        return self._run(lambda s: trials.get_sweep(s, sweep_id), write=False)

    def record_trial(self, rec: TrialRecord) -> int:
        """Write one finished trial; committed (durable) when this returns."""
        return self._run(lambda s: trials.record_trial(s, rec, self._ids), write=True)

    def trials(
        self,
        *,
        sweep_id: int | None = None,
        backend: str | None = None,
        status: str | None = None,
        device_kind: str | None = None,
        problem_key: str | None = None,
        limit: int | None = None,
    ) -> list[TrialRow]:
        """Matching trials, newest first."""
        filters = dict(
            sweep_id=sweep_id,
            backend=backend,
            status=status,
            device_kind=device_kind,
            problem_key=problem_key,
            limit=limit,
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

    def promote(self, trial_id: int, *, reason: str = "") -> int:
        """Make an ok trial the active winner of its key; the previous winner stays, superseded."""
        return self._run(lambda s: winners.promote(s, trial_id, reason), write=True)

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

    def misses(self, *, device_kind: str | None = None, backend: str | None = None) -> list[MissRow]:
        return self._run(lambda s: misses.misses(s, device_kind=device_kind, backend=backend), write=False)

    # --- config packs -----------------------------------------------------------------------------

    def export_pack(self, *, device_kind: str, backend: str) -> Pack:
        return self._run(
            lambda s: pack_io.export_pack(s, device_kind=device_kind, backend=backend), write=False
        )

    def import_pack(self, pack: Pack, *, source: str = "<pack>") -> int:
        """Check the whole pack first (PackInvalid, nothing written), then import it a chunk of entries
        per transaction, so that other writers get the lock in between (pack_io.import_pack)."""
        checked = pack_io.check_pack(pack, source)
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
