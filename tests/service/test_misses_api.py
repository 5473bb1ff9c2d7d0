"""POST /api/misses: the token, a bounded batch of validated misses, counted atomically; 1,000 misses
posted at once by many threads against a real server are all counted, on SQLite and PostgreSQL."""

from __future__ import annotations

import concurrent.futures
import dataclasses

import httpx
import pytest

from moetune.db import open_store
from moetune.service.app import create_app
from moetune.service.misses_api import MAX_BATCH, MAX_BODY_BYTES
from moetune.service.settings import ServiceSettings
from tests.service.live_server import TOKEN, serving
from tests.service.local_client import local_client
from tests.service.seeds import FP, MISSED

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def miss(problem=MISSED, device=FP, backend="xla") -> dict:
    return {"device": device.to_dict(), "backend": backend, "problem": problem.to_dict()}


@pytest.fixture
def api(sqlite_url):
    with local_client(create_app(ServiceSettings(db_url=sqlite_url, token=TOKEN))) as client:
        yield client


@pytest.fixture(scope="module")
def refusing(tmp_path_factory):
    """One server for the refusals: each must leave its database without a miss, so they can share it."""
    url = f"sqlite:///{tmp_path_factory.mktemp('refusals') / 'moetune.db'}"
    with local_client(create_app(ServiceSettings(db_url=url, token=TOKEN))) as client:
        yield client, url


def counts(url: str) -> dict[str, int]:
    with open_store(url, read_only=True) as store:
        return {m.problem.key: m.count for m in store.misses()}


def test_a_batch_is_counted(api, sqlite_url):
    batch = [miss(), miss(), miss(MISSED.with_m(32)), miss(backend="mosaic_gpu")]
    response = api.post("/api/misses", json={"misses": batch}, headers=AUTH)
    assert response.status_code == 200 and response.json() == {"counted": 4}
    with open_store(sqlite_url, read_only=True) as store:
        assert sorted((m.backend, m.problem.m, m.count) for m in store.misses()) == [
            ("mosaic_gpu", 64, 1),
            ("xla", 32, 1),
            ("xla", 64, 2),
        ]


def test_a_write_without_the_token_counts_nothing(api, sqlite_url):
    assert api.post("/api/misses", json={"misses": [miss()]}).status_code == 401
    assert counts(sqlite_url) == {}


@pytest.mark.parametrize(
    "body, where",
    [
        ({"misses": []}, "body.misses"),
        ({"misses": [miss()] * (MAX_BATCH + 1)}, "body.misses"),
        ({"misses": [miss() | {"extra": 1}]}, "body.misses.0.extra"),
        ({"misses": [miss(), miss(backend="Bad Name")]}, "body.misses.1.backend"),
        ({"misses": [miss() | {"problem": MISSED.to_dict() | {"m": 0}}]}, "body.misses.0.problem.m"),
        ({"misses": [miss() | {"problem": MISSED.to_dict() | {"m": "64"}}]}, "body.misses.0.problem.m"),
        ({"misses": [miss() | {"problem": MISSED.to_dict() | {"op": "nope"}}]}, "body.misses.0.problem.op"),
        ({"misses": [miss(device=dataclasses.replace(FP, device_kind="x" * 129))]}, "body.misses.0.device"),
        (  # each field fine, the rule between two broken: swiglu's n holds two halves
            {"misses": [miss() | {"problem": MISSED.to_dict() | {"op": "grouped_matmul_swiglu", "n": 15}}]},
            "misses.0.problem",
        ),
    ],
)
def test_a_bad_batch_is_422_in_one_line_and_counts_nothing(refusing, body, where):
    api, url = refusing
    response = api.post("/api/misses", json=body, headers=AUTH)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail.startswith(where) and "\n" not in detail
    assert counts(url) == {}


def test_a_body_over_the_bound_is_refused_before_it_is_parsed(api, sqlite_url):
    huge = b'{"misses": [' + b" " * MAX_BODY_BYTES + b"]}"
    assert api.post("/api/misses", content=huge, headers=AUTH).status_code == 413

    def chunks():  # no Content-Length: counted as it arrives
        yield huge

    assert api.post("/api/misses", content=chunks(), headers=AUTH).status_code == 413
    assert api.post("/api/misses", content=b"{", headers=AUTH).status_code == 422
    assert counts(sqlite_url) == {}


MISSES, PER_POST, THREADS = 1000, 10, 16


def test_a_thousand_misses_posted_at_once_are_all_counted(db_url):
    """Half on one key (every increment races the others), the rest spread over four keys; posted ten
    to a request by 16 threads."""
    problems = [MISSED if i % 2 else MISSED.with_m(8 << (i % 8)) for i in range(MISSES)]
    batches = [problems[i : i + PER_POST] for i in range(0, MISSES, PER_POST)]
    with serving(db_url) as base, httpx.Client(base_url=base, headers=AUTH) as client:

        def post(batch) -> int:
            response = client.post("/api/misses", json={"misses": [miss(p) for p in batch]})
            return response.json()["counted"]

        with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
            posted = list(pool.map(post, batches))
    assert posted == [PER_POST] * len(batches)
    expected: dict[str, int] = {}
    for problem in problems:
        expected[problem.key] = expected.get(problem.key, 0) + 1
    assert counts(db_url) == expected and sum(expected.values()) == MISSES
