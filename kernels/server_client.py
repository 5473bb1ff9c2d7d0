"""A JAX process's link to a `moetune serve` server ($MOETUNE_SERVER=http://host:port): config packs
fetched from it, and dispatch misses reported to it, both in background threads.

A trace never waits on the network. `pack()` answers at once with what is at hand: the pack this
process fetched, else the copy cached on disk by an earlier process, else None (the lookup then uses
the shipped packs). The first call per (device kind, backend), and each call REFRESH_S after the last
fetch, start a fetch in a thread: If-None-Match with the cached ETag, TIMEOUT_S at most; a 200 replaces
the cached copy, a 304 keeps it, anything else (the server down, slow, or answering nonsense) is logged
once and changes nothing. Each fetched pack bumps `generation`, which the lookup keys its tables by.

Misses go into a bounded queue that one thread posts in batches of at most BATCH to /api/misses with
$MOETUNE_SERVER_TOKEN; a batch the server does not take, a miss with no token to send it, or one the
full queue cannot hold is dropped and counted in `dropped`, never raised. At exit, what is queued gets
EXIT_FLUSH_S to go out.

Under `jit` the first trace of a function is often its only one, so a pack that lands after it is never
used by that program. Two ways to have the server's packs at the first trace, each bounded:
$MOETUNE_SERVER_WAIT=S makes the first `pack()` per (device kind, backend) wait up to S seconds for its
fetch; `prefetch()` fetches the packs of this process's GPU model before the first trace and returns
each one's status. Past the bound, the trace goes on as it would have.

Only the standard library (urllib) is used, so importing moetune.kernels stays light.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import json
import logging
import math
import os
import queue
import tempfile
import threading
import time
import urllib.error
import urllib.parse
from pathlib import Path
from typing import Any

from moetune.kernels import packs
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import PackInvalid
from moetune.kernels.problem import Problem

log = logging.getLogger(__name__)

ENV_SERVER = "MOETUNE_SERVER"
ENV_TOKEN = "MOETUNE_SERVER_TOKEN"
ENV_WAIT = "MOETUNE_SERVER_WAIT"  # seconds the first lookup per pack waits for its fetch (default 0)
PREFETCH_TIMEOUT_S = 10.0
TIMEOUT_S = 2.0  # per request; a trace never waits for it
REFRESH_S = 300.0  # a long-running process asks again this often (a 304 costs the server little)
BATCH = 100  # misses per POST; the server takes up to 1000
QUEUE_MAX = 10_000
EXIT_FLUSH_S = 1.0
CACHE_FOLDER = "server-packs"


@dataclasses.dataclass
class _Held:
    """What this process knows of one pack: the copy at hand, its ETag, and the fetch state."""

    pack: packs.Pack | None = None
    etag: str | None = None
    fetched_at: float = -math.inf
    fetching: bool = False
    last_status: int | str | None = None  # HTTP status of the last fetch, or why it failed


class ServerClient:
    """Thread-safe; one per server URL in a process (`current()`)."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        cache_dir: str | Path | None = None,
        timeout_s: float = TIMEOUT_S,
        refresh_s: float = REFRESH_S,
        first_wait_s: float = 0.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token or None
        self.timeout_s = timeout_s
        self.refresh_s = refresh_s
        self.first_wait_s = first_wait_s
        server_slug = hashlib.sha256(self.base_url.encode()).hexdigest()[:16]
        self.cache_dir = Path(cache_dir or _user_cache_dir()) / CACHE_FOLDER / server_slug
        self.generation = 0
        self.sent = 0
        self.dropped = 0
        self._held: dict[tuple[str, str], _Held] = {}
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._misses: queue.Queue[dict[str, Any]] = queue.Queue(QUEUE_MAX)
        self._pending = 0  # misses queued or being posted
        self._sender: threading.Thread | None = None
        self._warned: set[str] = set()

    # -- packs -----------------------------------------------------------------------------------------

    def pack(self, device_kind: str, backend: str) -> packs.Pack | None:
        """The freshest pack at hand; starts a background fetch when one is due. Never waits, except the
        first call per pack of a client made with `first_wait_s` ($MOETUNE_SERVER_WAIT): that one waits
        up to first_wait_s for its fetch."""
        key = (device_kind, backend)
        with self._idle:
            first = key not in self._held
            held = self._start(key)
            if first and self.first_wait_s > 0:
                self._wait_fetched([key], time.monotonic() + self.first_wait_s)
            return held.pack

    def prefetch(
        self, device_kind: str, backends: list[str], timeout_s: float = PREFETCH_TIMEOUT_S
    ) -> dict[str, int | str | None]:
        """Fetch the packs of `device_kind` for `backends` now (a fetch already in flight is awaited
        instead), waiting up to timeout_s in all; each backend's status (200, 304, 404, why it failed, or
        None where the time ran out). The next lookup uses what arrived."""
        keys = [(device_kind, backend) for backend in backends]
        with self._idle:
            for key in keys:
                self._start(key, force=True)
            self._wait_fetched(keys, time.monotonic() + timeout_s)
            return {
                backend: (None if (h := self._held[key]).fetching else h.last_status)
                for backend, key in zip(backends, keys, strict=True)
            }

    def _start(self, key: tuple[str, str], *, force: bool = False) -> _Held:
        """The key's state (read from the disk cache the first time), a fetch started if one is due
        (or `force`) and none is in flight. Call with the lock held."""
        held = self._held.get(key)
        if held is None:
            held = self._held[key] = self._read_cache(key)
        due = force or time.monotonic() - held.fetched_at >= self.refresh_s
        if due and not held.fetching:
            held.fetching = True
            threading.Thread(target=self._fetch, args=(key,), name="moetune-pack-fetch", daemon=True).start()
        return held

    def _wait_fetched(self, keys: list[tuple[str, str]], deadline: float) -> None:
        """Wait (the lock held, released while waiting) until none of `keys` is fetching, or the deadline."""
        while any(self._held[key].fetching for key in keys):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._idle.wait(left)

    def status(self, device_kind: str, backend: str) -> int | str | None:
        """The last fetch's HTTP status (200, 304, 404, ...) or why it failed; None before one ended."""
        with self._lock:
            held = self._held.get((device_kind, backend))
            return None if held is None else held.last_status

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no fetch is in flight and no miss is waiting (tests, exit); False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._pending or any(h.fetching for h in self._held.values()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
            return True

    def _fetch(self, key: tuple[str, str]) -> None:
        device_kind, backend = key
        with self._lock:
            etag = self._held[key].etag
        path = f"/api/packs/{urllib.parse.quote(device_kind, safe='')}/{urllib.parse.quote(backend, safe='')}"
        headers = {"If-None-Match": etag} if etag else {}
        status: int | str
        fetched: tuple[packs.Pack, str | None] | None = None
        try:
            status, body, reply_etag = self._request("GET", path, headers=headers)
            if status == 200:
                if len(body) > packs.MAX_PACK_BYTES:
                    raise PackInvalid(f"the pack is over {packs.MAX_PACK_BYTES} bytes")
                fetched = (
                    packs.parse(packs.decode(body, self.base_url + path), self.base_url + path),
                    reply_etag,
                )
                self._write_cache(key, body, reply_etag)
        except (OSError, PackInvalid, ValueError) as e:  # refused, timed out, not a pack: keep what we have
            status = f"{type(e).__name__}: {e}"
            self._warn_once(
                f"fetch {self.base_url}", f"moetune: cannot fetch config packs from {self.base_url}: {e}"
            )
        with self._idle:
            held = self._held[key]
            if fetched is not None:
                held.pack, held.etag = fetched
                self.generation += 1
            held.fetching, held.fetched_at, held.last_status = False, time.monotonic(), status
            self._idle.notify_all()

    def _cache_file(self, key: tuple[str, str]) -> Path:
        return self.cache_dir / packs.file_name(*key)

    def _read_cache(self, key: tuple[str, str]) -> _Held:
        """The copy an earlier fetch left: {"etag": ..., "pack": <the pack's JSON text>}, one file, so that
        a pack and its ETag are replaced together. A missing or unreadable copy is no copy."""
        path = self._cache_file(key)
        try:
            cached = json.loads(path.read_text())
            pack = packs.parse(packs.decode(cached["pack"].encode(), str(path)), str(path))
            return _Held(pack=pack, etag=cached.get("etag"))
        except FileNotFoundError:
            return _Held()
        except (OSError, ValueError, KeyError, TypeError, AttributeError, PackInvalid) as e:
            self._warn_once(f"cache {path}", f"moetune: ignoring the cached config pack {path}: {e}")
            return _Held()

    def _write_cache(self, key: tuple[str, str], body: bytes, etag: str | None) -> None:
        path = self._cache_file(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump({"etag": etag, "pack": body.decode()}, f)
            os.replace(tmp, path)
        except OSError as e:  # a read-only home: the pack is still used by this process
            self._warn_once(f"cache {path}", f"moetune: cannot cache the config pack in {path}: {e}")

    # -- misses ----------------------------------------------------------------------------------------

    def report_miss(self, device: DeviceFingerprint, backend: str, problem: Problem) -> None:
        """Queue one miss for the server; returns at once."""
        if self.token is None:
            self._warn_once(
                "no token", f"moetune: not reporting misses to {self.base_url}: ${ENV_TOKEN} is unset"
            )
            with self._lock:
                self.dropped += 1
            return
        miss = {"device": device.to_dict(), "backend": backend, "problem": problem.to_dict()}
        with self._lock:
            try:
                self._misses.put_nowait(miss)
            except queue.Full:
                self.dropped += 1
                return
            self._pending += 1
            if self._sender is None:
                self._sender = threading.Thread(
                    target=self._send_forever, name="moetune-miss-sender", daemon=True
                )
                self._sender.start()

    def _send_forever(self) -> None:
        while True:
            batch = [self._misses.get()]
            while len(batch) < BATCH:
                try:
                    batch.append(self._misses.get_nowait())
                except queue.Empty:
                    break
            sent = False
            try:
                status, _, _ = self._request("POST", "/api/misses", body={"misses": batch})
                sent = status == 200
                if not sent:
                    self._warn_once(
                        f"post {status}", f"moetune: {self.base_url} refused misses (HTTP {status})"
                    )
            except OSError as e:
                self._warn_once(
                    f"post {self.base_url}", f"moetune: cannot report misses to {self.base_url}: {e}"
                )
            with self._idle:
                if sent:
                    self.sent += len(batch)
                else:
                    self.dropped += len(batch)
                self._pending -= len(batch)
                self._idle.notify_all()

    # -- the wire --------------------------------------------------------------------------------------

    def _request(
        self, method: str, path: str, *, headers: dict[str, str] | None = None, body: Any = None
    ) -> tuple[int, bytes, str | None]:
        """(status, body, ETag); an HTTP error status is returned, a network failure raises OSError."""
        import urllib.request

        headers = dict(headers or {})
        if self.token is not None:  # reads may be protected; writes always are
            headers["Authorization"] = f"Bearer {self.token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.base_url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return response.status, response.read(packs.MAX_PACK_BYTES + 1), response.headers.get("ETag")
        except urllib.error.HTTPError as e:  # 304 comes here too
            try:
                return e.code, b"", e.headers.get("ETag")
            finally:
                e.close()

    def _warn_once(self, subject: str, message: str) -> None:
        with self._lock:
            if subject in self._warned:
                return
            self._warned.add(subject)
        log.warning("%s", message)


def _user_cache_dir() -> Path:
    try:
        import platformdirs
    except ImportError:  # a GPU image with jax but not the tuner's packages
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "moetune"
    return Path(platformdirs.user_cache_dir("moetune"))


_clients: dict[tuple[str, str | None], ServerClient] = {}
_clients_lock = threading.Lock()


def current() -> ServerClient | None:
    """The client for $MOETUNE_SERVER (with $MOETUNE_SERVER_TOKEN), or None when it is unset."""
    url = os.environ.get(ENV_SERVER)
    if not url:
        return None
    key = (url, os.environ.get(ENV_TOKEN) or None)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = ServerClient(url, token=key[1], first_wait_s=_first_wait_s())
            atexit.register(client.wait_idle, EXIT_FLUSH_S)
        return client


def _first_wait_s() -> float:
    text = os.environ.get(ENV_WAIT, "").strip()
    if not text:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 600:  # NaN too
        log.warning("moetune: ignoring $%s=%r: seconds in [0, 600]", ENV_WAIT, text)
        return 0.0
    return value


def prefetch(
    device_kind: str | None = None,
    backends: list[str] | None = None,
    timeout_s: float = PREFETCH_TIMEOUT_S,
) -> dict[str, int | str | None]:
    """Fetch this process's config packs from $MOETUNE_SERVER before the first trace, so that a program
    jitted once is built with the server's winners: each backend's status (200, 304, 404, why a fetch
    failed, None where timeout_s ran out); {} when $MOETUNE_SERVER is unset. `device_kind`: jax's
    device_kind of the first device unless given; `backends`: every registered backend unless given.

        from moetune.kernels import server_client
        server_client.prefetch()          # once, before the first jax.jit call

    Never raises for the server's sake: a server that is down is a status, and the lookup then goes on
    with the cached and shipped packs."""
    client = current()
    if client is None:
        return {}
    if device_kind is None:
        import jax

        device_kind = jax.devices()[0].device_kind
    if backends is None:
        from moetune.kernels import registry

        backends = list(registry.names())
    return client.prefetch(device_kind, backends, timeout_s)


def forget() -> None:
    """Drop every client (tests; a process that changed $MOETUNE_SERVER)."""
    with _clients_lock:
        _clients.clear()
