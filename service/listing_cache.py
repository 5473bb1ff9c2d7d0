"""Listings and pages rendered at most once per CACHE_S per URL, served from memory with a strong ETag.

Under a herd of clients, a listing (GET /api/winners?...) or a page (/winners) would otherwise be queried
and rendered once per request: the winners listing judges every winner against this server's device and
kernel sources, the winners page reads every sweep's report. ListingCache sits in front of the app (an
ASGI middleware) and keeps each 200 answer of a cached GET, keyed by its path and query string:

  - fresh (read less than its lifetime ago): served from memory, without touching the app or a thread.
    The lifetime is CACHE_S, or RENDER_SHARE times what its render took if that is longer: a sweep page
    whose report takes 2 s to draw is drawn again every 20 s at most, so re-renders take at most a tenth
    of a core however many clients ask;
  - older: still served at once, and one re-render is started in the background (stale while
    revalidate), so a slow render holds up no client after the first;
  - never rendered: the first request renders it, and every request meanwhile awaits that one render
    (single flight), as the packs' cache does (service/packs_api.py). A pack (FRESH_ONLY) is never served
    stale: once older than CACHE_S the next request awaits its re-read.

Each body carries a strong ETag (a hash of its bytes); a request whose If-None-Match names it gets 304.
Data is at most about CACHE_S old, plus one render. Only 200s are kept; errors pass through every time.
With --protect-reads a request without the token is passed to the app, which refuses it: the cache never
answers a client the app would not. Entries not asked for in IDLE_S are dropped, and at most MAX_ENTRIES
are kept (the oldest dropped first), so a client walking many pages or filters cannot grow it unbounded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from moetune.service.auth import token_matches

CACHE_S = 1.0
RENDER_SHARE = 10.0
IDLE_S = 300.0
MAX_ENTRIES = 512
MAX_BODY_BYTES = 8 << 20  # a larger answer is served but not kept
# GET routes whose answers are kept (prefixes of the path): the read API's listings and the pages.
# /api/health too: it reads the database's schema revision, which costs as much as a listing.
CACHED = ("/api/health", "/api/winners", "/api/sweeps", "/api/misses", "/api/jobs", "/api/packs")
# Never served older than CACHE_S: an expired pack is read again before it is answered (single flight,
# as packs_api's own cache does), so a client that polls after a promotion gets the new winner, never the
# copy before it. The packs' ETag here is packs_api's (the same hash of the same bytes).
FRESH_ONLY = ("/api/packs",)
CACHED_PAGES = ("/", "/winners", "/misses", "/stale", "/jobs", "/compare")
CACHED_PAGE_PREFIXES = ("/sweeps/", "/jobs/", "/parts/")


@dataclasses.dataclass
class _Entry:
    read_at: float
    render_s: float  # what reading it took
    used_at: float
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    etag: bytes
    version: Any = None  # a FRESH_ONLY answer's data version when it was read (`version`)


def cached_path(path: str) -> bool:
    return (
        path.startswith(CACHED) or path in CACHED_PAGES or path.startswith(("/sweeps/", "/jobs/", "/parts/"))
    )


def _lifetime_s(path: str, entry: _Entry) -> float:
    """How long a kept answer is served as it is: CACHE_S, or RENDER_SHARE times its render."""
    return CACHE_S if path.startswith(FRESH_ONLY) else max(CACHE_S, RENDER_SHARE * entry.render_s)


def etag_of(body: bytes) -> bytes:
    return b'"' + hashlib.sha256(body).hexdigest()[:32].encode() + b'"'


def _matches(if_none_match: bytes, etag: bytes) -> bool:
    tags = [tag.strip().removeprefix(b"W/") for tag in if_none_match.split(b",")]
    return b"*" in tags or etag in tags


class ListingCache:
    """`version`: a cheap read of what FRESH_ONLY answers are made from (the winners table's count and
    newest changes): an expired pack whose version has not moved is kept another CACHE_S without being
    rendered again, so the requests waiting on it wait for one small query, not a render."""

    def __init__(self, app: ASGIApp, settings: Any, version: Callable[[], Any] | None = None) -> None:
        self.app = app
        self.settings = settings
        self.version = version
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._rendering: dict[bytes, asyncio.Task] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD", "OPTIONS"):
            # A write through this server (a job submitted or cancelled, misses counted): every kept
            # answer may be out of date, so none is served again. Writes by workers and sweeps go to the
            # database directly and show within CACHE_S.
            self._entries.clear()
            await self.app(scope, receive, send)
            return
        if scope["method"] != "GET" or not cached_path(scope["path"]):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        given = headers.get(b"authorization", b"").decode("latin-1")
        if self.settings.protect_reads and not token_matches(given, self.settings.token):
            await self.app(scope, receive, send)  # the app answers 401
            return
        key = scope["path"].encode() + b"?" + scope.get("query_string", b"")
        now = time.monotonic()
        entry = self._entries.get(key)
        if entry is None:
            entry = await self._render(key, scope)
            if entry is None:  # not a 200, or too large to keep: the app answers this request itself
                await self.app(scope, receive, send)
                return
        elif now - entry.read_at > _lifetime_s(scope["path"], entry):
            if scope["path"].startswith(FRESH_ONLY):
                entry = await self._render(key, scope)
                if entry is None:
                    await self.app(scope, receive, send)
                    return
            elif key not in self._rendering:
                self._start(key, scope)  # stale while revalidate: this request gets the copy at hand
        entry.used_at = now
        self._entries.move_to_end(key)
        await _send(send, entry, headers.get(b"if-none-match"))

    def _start(self, key: bytes, scope: Scope) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(self._run(key, dict(scope)))
        self._rendering[key] = task
        return task

    async def _render(self, key: bytes, scope: Scope) -> _Entry | None:
        task = self._rendering.get(key) or self._start(key, scope)
        return await asyncio.shield(task)  # one client leaving does not cancel the others' render

    async def _run(self, key: bytes, scope: Scope) -> _Entry | None:
        try:
            read_at = time.monotonic()
            version = None
            if self.version is not None and scope["path"].startswith(FRESH_ONLY):
                try:
                    version = await run_in_threadpool(self.version)
                except Exception:  # the database: the render below meets it too, and answers it (503)
                    version = None
                kept = self._entries.get(key)
                if version is not None and kept is not None and kept.version == version:
                    kept.read_at = time.monotonic()  # nothing it is made of changed
                    return kept
            start: dict[str, Any] = {}
            chunks: list[bytes] = []

            async def receive() -> Message:
                return {"type": "http.request", "body": b"", "more_body": False}

            async def capture(message: Message) -> None:
                if message["type"] == "http.response.start":
                    start.update(message)
                elif message["type"] == "http.response.body":
                    chunks.append(message.get("body", b""))

            await self.app(scope, receive, capture)
            body = b"".join(chunks)
            if start.get("status") != 200 or len(body) > MAX_BODY_BYTES:
                self._entries.pop(key, None)
                return None
            kept = [(k, v) for k, v in start.get("headers", []) if k.lower() in (b"content-type",)]
            took = time.monotonic() - read_at
            entry = _Entry(read_at, took, read_at, 200, kept, body, etag_of(body), version)
            self._entries[key] = entry
            self._entries.move_to_end(key)
            self._evict(read_at)
            return entry
        finally:
            del self._rendering[key]

    def _evict(self, now: float) -> None:
        while len(self._entries) > MAX_ENTRIES:
            self._entries.popitem(last=False)
        idle = [k for k, e in self._entries.items() if now - e.used_at > IDLE_S]
        for k in idle:
            del self._entries[k]


async def _send(send: Send, entry: _Entry, if_none_match: bytes | None) -> None:
    common = [(b"etag", entry.etag), (b"cache-control", b"no-cache")]
    if if_none_match is not None and _matches(if_none_match, entry.etag):
        await send({"type": "http.response.start", "status": 304, "headers": common})
        await send({"type": "http.response.body", "body": b""})
        return
    length = [(b"content-length", str(len(entry.body)).encode())]
    headers = entry.headers + common + length
    await send({"type": "http.response.start", "status": entry.status, "headers": headers})
    await send({"type": "http.response.body", "body": entry.body})
