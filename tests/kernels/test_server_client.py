"""$MOETUNE_SERVER: packs fetched in the background and cached with their ETag, misses reported in
batches; a trace never waits on the network: a server that does not answer (blocked on an Event, so
the proof needs no timing threshold) or a dead port leaves the lookup to the cache and the shipped
packs, and its misses are dropped and counted."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from fastapi import FastAPI

from moetune.db import open_store
from moetune.kernels import server_client
from moetune.kernels.backends.xla import BACKEND
from moetune.kernels.lookup import LOOKUP
from moetune.kernels.server_client import ServerClient
from moetune.service import listing_cache, packs_api
from tests.service.live_server import TOKEN, serving
from tests.service.seeds import DENSE, FP, FRESH, MISSED, SEGMENTS, record, seed

WAIT_S = 30  # only ever reached when something is broken


@pytest.fixture
def server(sqlite_url):
    seed(sqlite_url)
    with serving(sqlite_url) as base:
        yield base


@pytest.fixture
def via(monkeypatch, tmp_path):
    """Point this process at a server (its client caching under tmp_path), as $MOETUNE_SERVER does."""

    def point(base: str, token: str | None = TOKEN) -> ServerClient:
        monkeypatch.setenv(server_client.ENV_SERVER, base)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
        if token:
            monkeypatch.setenv(server_client.ENV_TOKEN, token)
        server_client.forget()
        LOOKUP.clear()
        return server_client.current()

    yield point
    server_client.forget()
    LOOKUP.clear()


def resolve(problem=FRESH):
    return LOOKUP.resolve(problem, BACKEND, FP)


def test_a_fetched_pack_serves_the_next_trace_and_is_cached_with_its_etag(server, via):
    client = via(server)
    first = resolve()
    assert not first.source.startswith("server")  # the fetch has only started
    assert client.wait_idle(WAIT_S) and client.status(FP.device_kind, "xla") == 200
    served = resolve()
    assert (served.source, served.config) == ("server exact", SEGMENTS)

    (cached,) = client.cache_dir.iterdir()
    etag = json.loads(cached.read_text())["etag"]
    assert etag.startswith('"')
    # A new process: the cached copy serves its first trace, and its fetch revalidates (304).
    again = via(server)
    assert resolve().source == "server exact"
    assert again.wait_idle(WAIT_S) and again.status(FP.device_kind, "xla") == 304


def test_a_long_running_process_sees_a_new_winner_at_its_next_refresh(server, via, sqlite_url, monkeypatch):
    monkeypatch.setattr(packs_api, "CACHE_S", 0.0)
    monkeypatch.setattr(listing_cache, "CACHE_S", 0.0)  # the server renders each request afresh
    client = via(server)
    resolve()
    assert client.wait_idle(WAIT_S) and resolve().config == SEGMENTS
    with open_store(sqlite_url) as store:
        store.promote(
            store.record_trial(record(FRESH, DENSE, sweep_id=None, source_hash=BACKEND.source_hash()))
        )
    client.refresh_s = 0.0  # a refresh is due at every trace
    assert resolve().config == SEGMENTS  # this trace starts the refresh and does not wait for it
    assert client.wait_idle(WAIT_S) and client.status(FP.device_kind, "xla") == 200
    assert resolve().config == DENSE


def test_misses_are_reported_in_the_background(server, via, sqlite_url):
    client = via(server)
    for m in (MISSED.m, 96):
        problem = MISSED.with_m(m)
        LOOKUP.note_use(problem, resolve(problem), FP)
    assert client.wait_idle(WAIT_S) and (client.sent, client.dropped) == (2, 0)
    with open_store(sqlite_url, read_only=True) as store:
        counted = {m.problem.m: m.count for m in store.misses()}
    assert counted == {64: 3, 32: 1, 96: 1}  # the seed's misses: 64 twice, 32 once


def test_a_server_that_does_not_answer_never_holds_up_a_trace(via, sqlite_url, tmp_path):
    release = threading.Event()
    asked = threading.Event()
    stalled = FastAPI()

    @stalled.get("/api/packs/{device_kind}/{backend}")
    @stalled.post("/api/misses")
    def stall() -> dict:
        asked.set()
        release.wait(WAIT_S)
        return {}

    with serving(sqlite_url, app=stalled) as base:
        client = via(base)
        try:
            resolution = resolve()  # returns while the server holds the fetch
            assert asked.wait(WAIT_S) and not release.is_set()
            LOOKUP.note_use(MISSED, resolve(MISSED), FP)  # returns while the server holds the post
            assert resolution.source == "heuristic" and client.status(FP.device_kind, "xla") is None
        finally:
            release.set()
        assert client.wait_idle(WAIT_S)


def test_a_dead_server_leaves_the_cache_and_drops_misses_counted(via, server, monkeypatch):
    client = via(server)
    resolve()
    assert client.wait_idle(WAIT_S)
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    down = via(dead)
    down.cache_dir = client.cache_dir  # the copy the live server left (its folder is per server URL)
    assert resolve().source == "server exact"
    LOOKUP.note_use(MISSED, resolve(MISSED), FP)
    assert down.wait_idle(WAIT_S)
    assert isinstance(down.status(FP.device_kind, "xla"), str) and (down.sent, down.dropped) == (0, 1)
    assert resolve().source == "server exact"  # the failed fetch kept the cached copy


def test_without_a_token_misses_are_dropped_counted(via):
    client = via("http://127.0.0.1:9", token=None)
    client.report_miss(FP, "xla", MISSED)
    assert (client.sent, client.dropped) == (0, 1)


def test_moetune_server_wait_lets_the_first_trace_use_the_servers_pack(server, via, monkeypatch):
    """Under jit the first trace is often the only one: $MOETUNE_SERVER_WAIT holds it for the fetch."""
    monkeypatch.setenv(server_client.ENV_WAIT, str(WAIT_S))
    via(server)
    assert resolve().source == "server exact"


def test_prefetch_fetches_before_the_first_trace_and_reports_each_status(server, via):
    via(server)
    statuses = server_client.prefetch(FP.device_kind, ["xla", "mosaic_gpu"], timeout_s=WAIT_S)
    assert statuses == {"xla": 200, "mosaic_gpu": 404}
    assert resolve().source == "server exact"


def test_prefetch_without_a_server_does_nothing(monkeypatch):
    monkeypatch.delenv(server_client.ENV_SERVER, raising=False)
    server_client.forget()
    assert server_client.prefetch("NVIDIA H200", ["xla"]) == {}


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "1e9"])
def test_a_bad_wait_is_ignored_with_a_warning(monkeypatch, value, caplog):
    monkeypatch.setenv(server_client.ENV_WAIT, value)
    assert server_client._first_wait_s() == 0.0
    assert server_client.ENV_WAIT in caplog.text


def test_the_wait_and_prefetch_are_bounded_when_the_server_does_not_answer(via, sqlite_url):
    release = threading.Event()
    stalled = FastAPI()

    @stalled.get("/api/packs/{device_kind}/{backend}")
    def stall() -> dict:
        release.wait(WAIT_S)
        return {}

    with serving(sqlite_url, app=stalled) as base:
        client = via(base)
        try:
            client.first_wait_s = 0.2
            started = time.monotonic()
            assert resolve().source == "heuristic"  # waited its 0.2 s at most, then went on
            assert 0.2 <= time.monotonic() - started < WAIT_S
            assert client.prefetch(FP.device_kind, ["xla"], timeout_s=0.2) == {"xla": None}
        finally:
            release.set()
        assert client.wait_idle(WAIT_S)
