"""The winner lookup: which tuned config a (problem, backend) gets on the running device, and why.

Order (DESIGN.md): an exact winner -> the winner of the nearest tuned M for the same shape_key (distance
|log m - log m'|; ties go to the larger M; at most NEAREST_MAX_RATIO away) -> the backend's heuristic
default. Winners come from, in
precedence order: test overlays, the database (read once per process), the packs of a moetune server
($MOETUNE_SERVER: fetched in the background, never waited for; kernels.server_client), the config packs
shipped in configs/tuned/. Precedence decides between winners for the same M; the nearest M is chosen first.

A winner whose device fingerprint or kernel source hash differs from the running ones is stale: it is
still used (a warm start beats a heuristic) and flagged, with a warning logged once.

Each miss (nearest or heuristic) is logged once per process and counted once per process in the
database's misses table, when a database is configured, and queued for the server, when one is; a
failure of either is logged, never raised.

`LOOKUP` is the one mutable object: tables load lazily per (sources, device fingerprint, backend), the
roster of available backends per device, and `clear()` drops them all. Overlays (`overlay`, `using_db`,
`using_packs`) live in a context variable, so a test's overlay never leaks into another thread or test.
The database loads only when one is configured ($MOETUNE_DB, or the default SQLite file exists), and
moetune.db with SQLAlchemy is imported only then.
"""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import dataclasses
import importlib
import importlib.resources
import logging
import math
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from moetune.kernels import packs, registry
from moetune.kernels.backend import Backend
from moetune.kernels.config import KernelConfig
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import ConfigInvalid, PackInvalid, UnknownBackend
from moetune.kernels.problem import Problem

log = logging.getLogger(__name__)

# A winner tuned for M rows stands in for M/4 .. 4*M (two power-of-two token buckets either way). Farther
# away the best tiles change regime (decode's split-K, memory-bound tiles vs prefill's compute-bound
# ones), and the backend's heuristic, which looks at M, is the better guess.
NEAREST_MAX_RATIO = 4

ENV_DB = "MOETUNE_DB"
# The winner database plugs into the lookup by module path, as a backend does (registry.py): the lookup
# needs `open_store(url, read_only=...)` (an object with `winners(...)`) and `urls.default_path()`, and the
# kernels never import the tuner's side at build time, so data flows one way (tests/test_import_graph.py).
WINNER_STORE = "moetune.db"
PACKS_PACKAGE = "moetune.configs"
PACKS_FOLDER = "tuned"
# Lower rank wins between winners for the same problem.
_ORIGIN_RANK = {"overlay": 0, "db": 1, "server": 2, "pack": 3}


@dataclasses.dataclass(frozen=True)
class Winner:
    """One tuned (problem, backend) -> config, from wherever it was stored.

    A hash left None was not recorded and is not compared (overlays built by hand in tests).
    """

    backend: str
    problem: Problem
    config: Mapping[str, Any]
    origin: str = "overlay"
    fingerprint_hash: str | None = None
    source_hash: str | None = None
    median_s: float | None = None

    def __post_init__(self) -> None:
        if self.origin not in _ORIGIN_RANK:
            raise ConfigInvalid(f"winner origin={self.origin!r} is not one of {', '.join(_ORIGIN_RANK)}")


@dataclasses.dataclass(frozen=True)
class Resolution:
    """The config one backend uses for one problem, and where it came from.

    source: "explicit config", "heuristic", or "<origin> exact" / "<origin> nearest" with origin one of
    overlay, db, server, pack; `from_m` is the tuned M a nearest winner came from; `stale` lists why the
    winner does not match the running device or kernel source (empty when it does).
    """

    backend: str
    config: KernelConfig
    source: str
    from_m: int | None = None
    stale: tuple[str, ...] = ()
    median_s: float | None = None

    @property
    def exact(self) -> bool:
        return self.source.endswith(" exact") or self.source == "explicit config"


@dataclasses.dataclass(frozen=True)
class _Entry:
    winner: Winner
    config: KernelConfig
    stale: tuple[str, ...]

    @property
    def rank(self) -> tuple[int, bool]:
        return _ORIGIN_RANK[self.winner.origin], bool(self.stale)

    def resolution(self, kind: str, from_m: int | None = None) -> Resolution:
        return Resolution(
            backend=self.winner.backend,
            config=self.config,
            source=f"{self.winner.origin} {kind}",
            from_m=from_m,
            stale=self.stale,
            median_s=self.winner.median_s,
        )


class _Table:
    """The winners of one backend on one device, indexed for exact and nearest-M lookups."""

    def __init__(self, entries: Iterable[_Entry]) -> None:
        self.exact: dict[str, _Entry] = {}
        for entry in entries:
            key = entry.winner.problem.key
            if key not in self.exact or entry.rank < self.exact[key].rank:
                self.exact[key] = entry
        by_shape: dict[str, list[tuple[int, _Entry]]] = {}
        for entry in self.exact.values():
            by_shape.setdefault(entry.winner.problem.shape_key, []).append((entry.winner.problem.m, entry))
        self.ms: dict[str, list[int]] = {}
        self.by_shape: dict[str, list[_Entry]] = {}
        for shape_key, items in by_shape.items():
            items.sort(key=lambda item: item[0])
            self.ms[shape_key] = [m for m, _ in items]
            self.by_shape[shape_key] = [e for _, e in items]

    def nearest(self, problem: Problem) -> _Entry | None:
        """The winner of the nearest tuned M, if within NEAREST_MAX_RATIO of the problem's M."""
        ms = self.ms.get(problem.shape_key)
        if not ms:
            return None
        # log is monotone, so the nearest M in log distance is one of the two sorted neighbours.
        i = bisect.bisect_left(ms, problem.m)
        candidates = [j for j in (i - 1, i) if 0 <= j < len(ms)]
        best = min(candidates, key=lambda j: (abs(math.log(ms[j]) - math.log(problem.m)), -ms[j]))
        if max(ms[best], problem.m) > NEAREST_MAX_RATIO * min(ms[best], problem.m):
            return None
        return self.by_shape[problem.shape_key][best]


_DEFAULT = object()  # "not overridden": the environment and the shipped packs decide
_UNRESOLVED = object()  # the default database path, before it is first needed


@dataclasses.dataclass(frozen=True, eq=False)
class _Sources:
    """Where winners come from; compared by identity, so a table cached for one overlay serves only it."""

    winners: tuple[Winner, ...] = ()
    # A URL, None (no database) or _DEFAULT ($MOETUNE_DB, else the default file when it exists).
    db: Any = _DEFAULT
    # A folder, None (no packs) or _DEFAULT (the packs shipped in moetune.configs).
    packs_dir: Any = _DEFAULT


class WinnerLookup:
    """Resolves (problem, backend, device) to a config; thread-safe; see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._tables: dict[tuple[_Sources, str | None, str, str], _Table] = {}
        self._stores: dict[tuple[str, bool], Any] = {}  # (url, read_only) -> Store, or why it failed
        self._rosters: dict[tuple[str, str], tuple[Backend, ...]] = {}
        self._logged: set[tuple[str, ...]] = set()
        self._default_db_file: Any = _UNRESOLVED  # then the Path, or None without platformdirs
        self._root = _Sources()
        self._sources: contextvars.ContextVar[_Sources] = contextvars.ContextVar("moetune_winner_sources")

    # -- configuration -------------------------------------------------------------------------------

    def clear(self) -> None:
        """Forget every loaded table, open database and logged-once message (a new process, in effect)."""
        with self._lock:
            stores, self._stores = self._stores, {}
            self._tables.clear()
            self._rosters.clear()
            self._logged.clear()
            self._default_db_file = _UNRESOLVED
        for store in stores.values():
            if not isinstance(store, Exception):
                store.close()

    @contextlib.contextmanager
    def overlay(
        self, *, winners: Iterable[Winner] = (), db: Any = _DEFAULT, packs_dir: Any = _DEFAULT
    ) -> Iterator[None]:
        """Within the block: `winners` take precedence over everything; `db` (a URL, or None for no
        database) and `packs_dir` (a folder, or None for no packs) replace the configured ones.

        Configs are looked up when a function is traced, so this reaches the traces made inside the block:
        a jitted function traced before it, with the same arguments, keeps its configs (jax.clear_caches()
        drops those traces)."""
        outer = self._current()
        sources = _Sources(
            winners=(*winners, *outer.winners),
            db=outer.db if db is _DEFAULT else db,
            packs_dir=outer.packs_dir
            if packs_dir is _DEFAULT
            else (None if packs_dir is None else Path(packs_dir)),
        )
        token = self._sources.set(sources)
        try:
            yield
        finally:
            self._sources.reset(token)
            with self._lock:
                for key in [k for k in self._tables if k[0] is sources]:
                    del self._tables[key]

    def using_db(self, url: str | None) -> contextlib.AbstractContextManager[None]:
        return self.overlay(db=url)

    def using_packs(self, folder: str | Path | None) -> contextlib.AbstractContextManager[None]:
        return self.overlay(packs_dir=folder)

    @contextlib.contextmanager
    def using_pack_file(self, path: str | Path) -> Iterator[None]:
        """Within the block: the winners of this one pack file, whatever its name, and no database or
        other pack (benchmarks compare two packs on one GPU this way). Raises PackInvalid for a bad file."""
        pack = packs.load(path)
        with tempfile.TemporaryDirectory() as folder:
            shutil.copy(path, Path(folder) / packs.file_name(pack.device.device_kind, pack.backend))
            with self.overlay(db=None, packs_dir=folder):
                yield

    def db_url(self) -> str | None:
        """The database winners come from now, or None when none is configured."""
        return self._db_url(self._current())

    # -- lookups -------------------------------------------------------------------------------------

    def backends(self, device: DeviceFingerprint) -> tuple[Backend, ...]:
        """The backends available on `device`, highest priority first (ties: the order of
        registry.default_backend). Cached: listing and importing every backend each trace costs ~1 ms."""
        key = (device.hash, os.environ.get(registry.ENV_EXTRA, ""))
        roster = self._rosters.get(key)
        if roster is None:
            usable = [
                registry.get(name) for name, reason in registry.available(device).items() if reason is None
            ]
            roster = tuple(sorted(usable, key=lambda b: (b.priority, b.name), reverse=True))
            with self._lock:
                self._rosters[key] = roster
        return roster

    def resolve(self, problem: Problem, backend: Backend, device: DeviceFingerprint) -> Resolution:
        """Exact winner, else nearest tuned M, else the heuristic. Logs nothing and records nothing."""
        table = self._table(backend, device)
        entry = table.exact.get(problem.key)
        if entry is not None:
            return entry.resolution("exact")
        entry = table.nearest(problem)
        if entry is not None:
            return entry.resolution("nearest", from_m=entry.winner.problem.m)
        return Resolution(backend.name, backend.heuristic(problem, device), "heuristic")

    def note_use(self, problem: Problem, resolution: Resolution, device: DeviceFingerprint) -> None:
        """What dispatch calls once it uses `resolution`: a miss is logged once and counted in the
        database (once per process and problem); a stale winner is warned about once."""
        if resolution.stale and self._first_time("stale", device.hash, resolution.backend, problem.key):
            log.warning(
                "moetune: using a stale %s winner for %s (%s); re-tune with `moetune tune`",
                resolution.backend,
                problem.key,
                "; ".join(resolution.stale),
            )
        if resolution.exact or not self._first_time("miss", device.hash, resolution.backend, problem.key):
            return
        log.info(
            "moetune: no tuned %s config for %s on %s; using the %s config %s",
            resolution.backend,
            problem.key,
            device.device_kind,
            resolution.source
            if resolution.from_m is None
            else f"{resolution.source} (m={resolution.from_m})",
            resolution.config,
        )
        sources = self._current()
        server = _server(sources)
        if server is not None:
            server.report_miss(device, resolution.backend, problem)  # queued: never waits on the network
        url = self._db_url(sources)
        if url is None:
            return
        try:
            self._store(url).record_miss(device=device, backend=resolution.backend, problem=problem)
        except Exception as e:  # the one edge where it is recorded: a database failure must not break a jit
            self.warn_once("miss-failed", url, f"moetune: could not count a miss in the database: {e}")

    # -- loading -------------------------------------------------------------------------------------

    def _current(self) -> _Sources:
        return self._sources.get(self._root)

    def _first_time(self, *key: str) -> bool:
        with self._lock:
            if key in self._logged:
                return False
            self._logged.add(key)
            return True

    def warn_once(self, kind: str, subject: str, message: str, *, level: int = logging.WARNING) -> None:
        """Log `message` the first time this process sees (kind, subject)."""
        if self._first_time(kind, subject):
            log.log(level, "%s", message)

    def _db_url(self, sources: _Sources) -> str | None:
        if sources.db is not _DEFAULT:
            return sources.db
        url = os.environ.get(ENV_DB)
        if url:
            return url
        if self._default_db_file is _UNRESOLVED:
            self._default_db_file = _default_db_path()
        path = self._default_db_file
        return f"sqlite:///{path}" if path is not None and path.is_file() else None

    def _table(self, backend: Backend, device: DeviceFingerprint) -> _Table:
        sources = self._current()
        url = self._db_url(sources)
        server = _server(sources)
        served = None
        if server is not None:
            # Starts a fetch when one is due (never waits); a fetched pack bumps the generation, so the
            # next trace gets a table holding it.
            server.pack(device.device_kind, backend.name)
            served = (server.base_url, server.generation)
        key = (sources, url, device.hash, backend.name, served)
        table = self._tables.get(key)
        if table is not None:
            return table
        with self._lock:
            table = self._tables.get(key)
            if table is None:
                table = _Table(self._entries(sources, url, server, backend, device))
                self._tables[key] = table
            return table

    def _entries(
        self,
        sources: _Sources,
        url: str | None,
        server: Any,
        backend: Backend,
        device: DeviceFingerprint,
    ) -> Iterator[_Entry]:
        winners = [w for w in sources.winners if w.backend == backend.name]
        if url is not None:
            winners += self._db_winners(url, backend.name, device)
        if server is not None:
            pack = server.pack(device.device_kind, backend.name)  # never waits on the network
            if pack is not None:
                winners += self._trusted_winners(
                    pack, f"{server.base_url} pack", backend.name, device, "server"
                )
        if sources.packs_dir is not None:
            winners += self._pack_winners(sources.packs_dir, backend.name, device)
        source_hash = backend.source_hash()
        for winner in winners:
            try:
                config = backend.config_class(winner.problem.op).from_dict(dict(winner.config))
            except (ConfigInvalid, TypeError) as e:
                self.warn_once(
                    "bad-config",
                    f"{winner.origin}:{winner.problem.key}",
                    f"moetune: ignoring a {winner.origin} winner for {winner.problem.key}: {e}",
                )
                continue
            yield _Entry(winner, config, stale_reasons(winner, device.hash, source_hash))

    def _db_winners(self, url: str, backend: str, device: DeviceFingerprint) -> list[Winner]:
        try:
            store = self._store(url, read_only=True)  # reading winners never creates or migrates a database
            rows = store.winners(device_kind=device.device_kind, backend=backend, active_only=True)
        except Exception as e:  # the one edge where it is recorded: a database failure must not break a jit
            self.warn_once("db-failed", url, f"moetune: not using the database for winners: {e}")
            return []
        return [db_winner(row) for row in rows]

    def _store(self, url: str, *, read_only: bool = False) -> Any:
        key = (url, read_only)
        with self._lock:
            if key not in self._stores:
                try:
                    self._stores[key] = importlib.import_module(WINNER_STORE).open_store(
                        url, read_only=read_only
                    )
                except Exception as e:
                    # Remembered, so a database that cannot open is tried once per process, not per call.
                    self._stores[key] = e
            store = self._stores[key]
        if isinstance(store, Exception):
            raise store
        return store

    def packs_folder(self) -> Traversable | None:
        """The folder config packs come from now, or None when packs are switched off."""
        folder = self._current().packs_dir
        return None if folder is None else _packs_folder(folder)

    def _pack_winners(self, folder: Any, backend: str, device: DeviceFingerprint) -> list[Winner]:
        resource = _packs_folder(folder) / packs.file_name(device.device_kind, backend)
        if not resource.is_file():
            return []
        try:
            pack = read_pack(resource)
        except PackInvalid as e:
            self.warn_once("bad-pack", str(resource), f"moetune: ignoring config pack: {e}")
            return []
        return self._trusted_winners(pack, str(resource), backend, device, "pack")

    def _trusted_winners(
        self, pack: packs.Pack, where: str, backend: str, device: DeviceFingerprint, origin: str
    ) -> list[Winner]:
        """The winners of a pack's trusted entries, when it is the pack of `backend` on `device`; what is
        left out is warned about once."""
        if pack.backend != backend or pack.device.device_kind != device.device_kind:
            self.warn_once(
                "wrong-pack",
                where,
                f"moetune: ignoring config pack {where}: it holds {pack.backend} winners for "
                f"{pack.device.device_kind!r}, not {backend} for {device.device_kind!r}",
            )
            return []
        trusted, rejected = trusted_pack_entries(pack)
        for reason in rejected:
            self.warn_once(
                "bad-pack-entry",
                f"{where}:{reason}",
                f"moetune: in config pack {where}, ignoring {reason}",
            )
        return _winners_of(pack, [entry for entry, _ in trusted], origin)


def _server(sources: _Sources) -> Any:
    """The $MOETUNE_SERVER client (kernels.server_client), where the shipped packs are in use: its packs
    stand in front of them. An overlay choosing other packs, or none, leaves the server out."""
    if sources.packs_dir is not _DEFAULT:
        return None
    from moetune.kernels import server_client

    return server_client.current()


def _packs_folder(folder: Any) -> Traversable:
    if folder is _DEFAULT:
        return importlib.resources.files(PACKS_PACKAGE) / PACKS_FOLDER
    return Path(folder)


def read_pack(resource: Traversable) -> packs.Pack:
    """Load one pack file, also from inside a zipped package; raises PackInvalid."""
    with importlib.resources.as_file(resource) as path:
        return packs.load(path)


def trusted_pack_entries(
    pack: packs.Pack,
) -> tuple[list[tuple[packs.PackEntry, KernelConfig]], list[str]]:
    """Which entries of a pack may be used, the one policy that dispatch and `moetune import` (which
    refuses a pack with any untrusted entry) apply: ((each trusted entry, its config typed by the
    backend's Config), why each other one is not trusted). Untrusted: every entry when the pack's backend
    is not registered here; a repeat of a problem an earlier entry holds; a config of the wrong types,
    with an unknown field or breaking a rule of its Config; and a config that a validity constraint of the
    backend's search space for that problem on the pack's device refuses (a pruning-only constraint,
    correct but wasteful, does not)."""
    from pydantic import ValidationError

    from moetune.kernels.pack_schema import typed_config
    from moetune.kernels.typed_fields import describe

    try:
        backend = registry.get(pack.backend)
    except UnknownBackend as e:
        return [], [f"pack is for backend {pack.backend!r}, not usable here ({e})"]
    trusted, rejected, seen = [], [], set()
    for i, entry in enumerate(pack.entries):
        key = entry.problem.key
        where = f"entries[{i}] ({key})"
        if key in seen:
            rejected.append(f"entries[{i}] repeats problem {key}")
            continue
        seen.add(key)
        try:
            config = typed_config(backend.config_class(entry.problem.op), entry.config)
        except ValidationError as e:
            rejected.append(f"{where}: bad {pack.backend} config: {describe(e, entry.config)}")
            continue
        except ConfigInvalid as e:
            rejected.append(f"{where}: bad {pack.backend} config: {e}")
            continue
        reason = _invalid_for(backend, entry.problem, config, pack.device)
        if reason is not None:
            rejected.append(f"{where}: {pack.backend} cannot run this config: {reason}")
            continue
        trusted.append((entry, config))
    return trusted, rejected


def _invalid_for(
    backend: Backend, problem: Problem, config: KernelConfig, device: DeviceFingerprint
) -> str | None:
    """Why `backend` cannot run `config` for `problem` on `device` (its search space's validity
    constraints), or None; a backend without a space to ask on this machine accepts it."""
    from moetune.kernels.errors import Unsupported

    try:
        backend.check(problem)
        space = backend.search_space(problem, device)
    except Unsupported as e:  # the backend declines the problem itself
        return str(e)
    except (ImportError, NotImplementedError):
        return None
    return space.invalid(problem, config, device)


def pack_winners(pack: packs.Pack) -> list[Winner]:
    """The winners of the pack's trusted entries (`trusted_pack_entries`)."""
    return _winners_of(pack, [entry for entry, _ in trusted_pack_entries(pack)[0]])


def _winners_of(pack: packs.Pack, entries: Iterable[packs.PackEntry], origin: str = "pack") -> list[Winner]:
    return [
        Winner(
            backend=pack.backend,
            problem=entry.problem,
            config=entry.config,
            origin=origin,
            fingerprint_hash=pack.device.hash,
            source_hash=pack.kernel_source_hash,
            median_s=entry.median_s,
        )
        for entry in entries
    ]


def db_winner(row: Any) -> Winner:
    """A winner from a database row (moetune.db.records.WinnerRow)."""
    return Winner(
        backend=row.backend,
        problem=row.problem,
        config=row.config,
        origin="db",
        fingerprint_hash=row.fingerprint_hash,
        source_hash=row.source_hash,
        median_s=row.median_s,
    )


def stale_reasons(winner: Winner, device_hash: str | None, source_hash: str | None) -> tuple[str, ...]:
    """Why `winner` does not match the running device and kernel source (empty when it does); a hash
    that is None, on either side, is not compared."""
    reasons = []
    if None not in (winner.fingerprint_hash, device_hash) and winner.fingerprint_hash != device_hash:
        reasons.append(f"tuned on device fingerprint {winner.fingerprint_hash}, running {device_hash}")
    if None not in (winner.source_hash, source_hash) and winner.source_hash != source_hash:
        reasons.append(f"tuned with kernel source {winner.source_hash}, running {source_hash}")
    return tuple(reasons)


def _default_db_path() -> Path | None:
    try:
        # The store's urls module imports neither SQLAlchemy nor the store: a jit without a database
        # stays light.
        return importlib.import_module(f"{WINNER_STORE}.urls").default_path()
    except ImportError:  # e.g. a GPU image with jax but not the tuner's packages: no default database
        return None


LOOKUP = WinnerLookup()
clear = LOOKUP.clear
overlay = LOOKUP.overlay
using_db = LOOKUP.using_db
using_packs = LOOKUP.using_packs
using_pack_file = LOOKUP.using_pack_file
