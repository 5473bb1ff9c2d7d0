"""The read API answers what the CLI's --json prints: winners (filters, stale), packs (the bytes of
`moetune export`, ETag and 304), sweeps, a sweep's trials a page at a time, misses most counted first;
bad parameters get 422 or 400 with one line, unknown records 404."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from moetune.cli import _load_commands, app
from moetune.db import open_store
from moetune.kernels import packs
from moetune.kernels.backends.xla import BACKEND
from moetune.service import listing_cache, packs_api
from moetune.service.app import create_app
from moetune.service.settings import ServiceSettings
from tests.service.live_server import TOKEN
from tests.service.local_client import local_client
from tests.service.seeds import DENSE, FP, FRESH, MISSED, STALE, record, seed

_load_commands()


@pytest.fixture
def seeded(sqlite_url):
    return sqlite_url, seed(sqlite_url)


@pytest.fixture
def api(seeded):
    url, _ = seeded
    with local_client(create_app(ServiceSettings(db_url=url, token=TOKEN))) as client:
        yield client


def cli_json(*args: str):
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def one_line(response, status: int) -> str:
    assert response.status_code == status, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail
    return detail


def test_winners_are_what_best_json_prints(api, seeded):
    url, _ = seeded
    assert api.get("/api/winners").json() == cli_json("best", "--db", url, "--no-packs")
    keys = {w["problem"]["key"]: w for w in api.get("/api/winners").json()}
    assert keys.keys() == {FRESH.key, STALE.key}
    assert keys[FRESH.key]["freshness"] == "fresh" and keys[STALE.key]["freshness"] == "stale"


def test_winner_filters(api):
    def keys(**params):
        return [w["problem"]["key"] for w in api.get("/api/winners", params=params).json()]

    assert keys(m=512) == [FRESH.key]
    assert keys(problem=STALE.key) == [STALE.key]
    assert keys(device_kind=FP.device_kind, backend="xla", op="grouped_matmul", k=32, n=16, g=4) == [
        STALE.key,
        FRESH.key,
    ]
    assert keys(m=8) == [] and keys(state="superseded") == []
    assert "'fake'" in one_line(api.get("/api/winners", params={"backend": "fake"}), 400)
    assert "op 'nope'" in one_line(api.get("/api/winners", params={"op": "nope"}), 400)
    assert one_line(api.get("/api/winners", params={"m": 0}), 422).startswith("query.m:")
    assert one_line(api.get("/api/winners", params={"state": "gone"}), 422).startswith("query.state:")
    assert one_line(api.get("/api/winners", params={"backend": "Not A Name"}), 422)


def test_stale_winners_say_why(api):
    (stale,) = api.get("/api/winners/stale").json()
    assert stale["problem"]["key"] == STALE.key
    assert len(stale["stale"]) == 1 and "kernel source 0000000000000000" in stale["stale"][0]


def test_a_pack_is_the_export_and_revalidates_with_its_etag(api, seeded, tmp_path, monkeypatch):
    monkeypatch.setattr(packs_api, "CACHE_S", 0.0)
    monkeypatch.setattr(listing_cache, "CACHE_S", 0.0)  # every request reads the database
    url, _ = seeded
    path = f"/api/packs/{FP.device_kind}/xla"
    response = api.get(path)
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    out = tmp_path / "pack.json"
    CliRunner().invoke(
        app, ["export", "--gpu", FP.device_kind, "--backend", "xla", "-o", str(out), "--db", url]
    )
    assert response.content == out.read_bytes()  # byte for byte, so kernels.packs loads it
    pack = packs.parse(packs.decode(response.content, "served"))
    assert {e.problem.key for e in pack.entries} == {FRESH.key}  # one kernel source per pack

    etag = response.headers["etag"]
    assert etag.startswith('"') and api.get(path).headers["etag"] == etag
    unchanged = api.get(path, headers={"If-None-Match": f'W/"other", {etag}'})
    assert unchanged.status_code == 304 and unchanged.content == b"" and unchanged.headers["etag"] == etag
    assert api.get(path, headers={"If-None-Match": '"other"'}).status_code == 200

    with open_store(url) as store:  # a new winner: new bytes, new tag
        current = BACKEND.source_hash()
        store.promote(store.record_trial(record(FRESH, DENSE, sweep_id=None, source_hash=current)))
    changed = api.get(path, headers={"If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["etag"] != etag


def test_a_rendered_pack_is_served_for_a_moment_without_the_database(api, seeded, monkeypatch):
    url, _ = seeded
    path = f"/api/packs/{FP.device_kind}/xla"
    first = api.get(path)
    with open_store(url) as store:
        store.promote(
            store.record_trial(record(FRESH, DENSE, sweep_id=None, source_hash=BACKEND.source_hash()))
        )
    assert api.get(path).content == first.content  # within CACHE_S of the first read
    monkeypatch.setattr(packs_api, "CACHE_S", 0.0)
    monkeypatch.setattr(listing_cache, "CACHE_S", 0.0)
    assert api.get(path).content != first.content


def test_a_pack_nobody_tuned_is_404_naming_what_exists(api):
    detail = one_line(api.get("/api/packs/NVIDIA H200/xla"), 404)
    assert FP.device_kind in detail
    assert one_line(api.get("/api/packs/NVIDIA H200/Bad-Name"), 422).startswith("path.backend:")


def test_sweeps_and_their_trials_a_page_at_a_time(api, seeded):
    url, seeded_ids = seeded
    sweeps = api.get("/api/sweeps").json()
    assert sweeps == cli_json("sweeps", "--db", url)
    assert api.get(f"/api/sweeps/{seeded_ids.sweep_id}").json() == sweeps[0]
    assert "999" in one_line(api.get("/api/sweeps/999"), 404)
    assert one_line(api.get("/api/sweeps/0"), 422).startswith("path.sweep_id:")

    trials = f"/api/sweeps/{seeded_ids.sweep_id}/trials"
    everything = api.get(trials).json()
    assert everything == cli_json("trials", "--db", url, "--sweep", str(seeded_ids.sweep_id))
    assert [t["id"] for t in everything] == list(reversed(seeded_ids.trial_ids))
    pages = [api.get(trials, params={"limit": 2, "offset": o}).json() for o in (0, 2, 4)]
    assert [[t["id"] for t in page] for page in pages] == [
        [seeded_ids.trial_ids[2], seeded_ids.trial_ids[1]],
        [seeded_ids.trial_ids[0]],
        [],
    ]
    assert [t["status"] for t in api.get(trials, params={"status": "compile_error"}).json()] == [
        "compile_error"
    ]
    assert one_line(api.get(trials, params={"limit": 1001}), 422).startswith("query.limit:")
    assert one_line(api.get("/api/sweeps/999/trials"), 404)


def test_misses_most_counted_first(api, seeded):
    url, _ = seeded
    misses = api.get("/api/misses").json()
    assert misses == cli_json("misses", "--db", url)
    assert [(m["problem"], m["count"]) for m in misses] == [(MISSED.key, 2), (MISSED.with_m(32).key, 1)]
    assert [m["count"] for m in api.get("/api/misses", params={"limit": 1, "offset": 1}).json()] == [1]
    assert one_line(api.get("/api/misses", params={"offset": -1}), 422).startswith("query.offset:")


def test_the_openapi_schema_documents_every_route(api):
    schema = api.get("/openapi.json").json()
    assert {
        "/api/winners",
        "/api/winners/stale",
        "/api/packs/{device_kind}/{backend}",
        "/api/sweeps",
        "/api/sweeps/{sweep_id}",
        "/api/sweeps/{sweep_id}/trials",
        "/api/misses",
    } <= schema["paths"].keys()
    post = schema["paths"]["/api/misses"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/MissBatch")
    limit = next(
        p
        for p in schema["paths"]["/api/sweeps/{sweep_id}/trials"]["get"]["parameters"]
        if p["name"] == "limit"
    )
    assert limit["schema"]["maximum"] == 1000


def test_concurrent_requests_for_an_expired_pack_render_it_once():
    import asyncio
    import threading
    import time

    from moetune.service.packs_api import _Rendered

    calls, lock = [], threading.Lock()

    def render():
        with lock:
            calls.append(1)
        time.sleep(0.05)  # long enough that every request below arrives while it runs
        return b"{}", '"tag"'

    async def herd():
        rendered = _Rendered()
        return await asyncio.gather(*(rendered.get(("gpu", "xla"), render) for _ in range(20)))

    assert asyncio.run(herd()) == [(b"{}", '"tag"')] * 20
    assert len(calls) == 1
