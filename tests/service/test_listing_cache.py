"""Listings and pages are paged and kept for a second with a strong ETag (service/listing_cache.py): the
same answer twice, 304 for a client holding it, a new answer once the copy is older than CACHE_S (the
stale one served while it is re-read), none kept across a write through the server, errors never kept,
and protected reads still refused without the token."""

from __future__ import annotations

import time

import pytest

from moetune.db import open_store
from moetune.service import listing_cache
from moetune.service.app import create_app
from moetune.service.settings import ServiceSettings
from tests.service.local_client import local_client
from tests.service.seeds import seed

TOKEN = "t" * 24
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JOB = {"problems": ["m=16,k=64,n=256,g=4,dtype=bf16"]}
WAIT_S = 30


@pytest.fixture
def client(sqlite_url):
    seed(sqlite_url)
    with local_client(create_app(ServiceSettings(db_url=sqlite_url, token=TOKEN))) as c:
        yield c


@pytest.mark.parametrize("path", ["/api/winners", "/api/sweeps", "/api/misses", "/api/jobs", "/", "/winners"])
def test_an_answer_is_kept_with_a_strong_etag_and_revalidated_with_304(client, path):
    first = client.get(path)
    assert first.status_code == 200 and first.headers["etag"].startswith('"')
    again = client.get(path)
    assert again.content == first.content and again.headers["etag"] == first.headers["etag"]
    unchanged = client.get(path, headers={"If-None-Match": first.headers["etag"]})
    assert unchanged.status_code == 304 and unchanged.content == b""
    assert unchanged.headers["etag"] == first.headers["etag"]


def test_listings_are_paged_by_default(client, sqlite_url):
    with open_store(sqlite_url) as store:
        for m in range(16, 16 * 130, 16):
            store.submit_job({"problems": [f"m={m},k=64,n=256,g=4,dtype=bf16"]})
    listed = client.get("/api/jobs").json()
    assert len(listed) == 100
    rest = client.get("/api/jobs", params={"offset": 100}).json()
    assert len(rest) == 29 and {j["id"] for j in rest}.isdisjoint(j["id"] for j in listed)
    assert len(client.get("/api/winners", params={"limit": 1}).json()) == 1
    both = client.get("/api/winners").json()
    assert client.get("/api/winners", params={"limit": 1, "offset": 1}).json() == both[1:]
    assert client.get("/api/winners", params={"limit": 1001}).status_code == 422


def test_a_newer_answer_follows_once_the_copy_is_older_than_cache_s(client, sqlite_url, monkeypatch):
    before = client.get("/api/jobs").json()
    with open_store(sqlite_url) as store:
        store.submit_job(JOB)  # a worker's or the CLI's write: not through this server
    assert client.get("/api/jobs").json() == before  # within CACHE_S: the copy
    monkeypatch.setattr(listing_cache, "CACHE_S", 0.0)
    deadline = time.monotonic() + WAIT_S
    while len(client.get("/api/jobs").json()) == len(before):  # the stale copy, then the re-read one
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_write_through_the_server_drops_every_kept_answer(client):
    assert client.get("/api/jobs").json() == []
    assert (
        client.post("/api/jobs", json=JOB | {"backend": "xla", "budget": 2}, headers=AUTH).status_code == 201
    )
    assert len(client.get("/api/jobs").json()) == 1


def test_errors_are_not_kept(client, sqlite_url):
    assert client.get("/api/sweeps/2").status_code == 404
    with open_store(sqlite_url) as store:
        store.create_sweep(backend="xla", strategy="grid", spec={}, host="h", user="u")
    assert client.get("/api/sweeps/2").status_code == 200


def test_protected_reads_are_refused_without_the_token_even_when_kept(sqlite_url):
    seed(sqlite_url)
    settings = ServiceSettings(db_url=sqlite_url, token=TOKEN, protect_reads=True)
    with local_client(create_app(settings)) as c:
        assert c.get("/api/winners", headers=AUTH).status_code == 200  # kept now
        assert c.get("/api/winners").status_code == 401
        assert c.get("/api/winners", headers={"Authorization": "Bearer " + "x" * 24}).status_code == 401
        assert c.get("/", headers=AUTH).status_code == 200
        assert c.get("/").status_code == 401


def test_an_expired_pack_is_rendered_again_only_when_the_winners_changed(client, sqlite_url, monkeypatch):
    from moetune.kernels.backends.xla import BACKEND
    from moetune.service import packs_api
    from tests.service.seeds import DENSE, FP, FRESH, record

    renders = []
    render = packs_api._render
    monkeypatch.setattr(packs_api, "_render", lambda *a: renders.append(1) or render(*a))
    monkeypatch.setattr(packs_api, "CACHE_S", 0.0)
    monkeypatch.setattr(listing_cache, "CACHE_S", 0.0)
    path = f"/api/packs/{FP.device_kind}/xla"
    first = client.get(path)
    for _ in range(3):
        assert client.get(path).content == first.content
    assert len(renders) == 1  # expired each time, the winners unchanged: the same copy
    with open_store(sqlite_url) as store:
        store.promote(
            store.record_trial(record(FRESH, DENSE, sweep_id=None, source_hash=BACKEND.source_hash()))
        )
    changed = client.get(path)
    assert changed.content != first.content and changed.headers["etag"] != first.headers["etag"]
    assert len(renders) == 2
