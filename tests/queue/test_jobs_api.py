"""The jobs API through FastAPI's TestClient on real SQLite and PostgreSQL: submit (the token; the same
checks as `moetune submit`; a bounded body), list, show, cancel; a restarted server keeps every job."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from moetune.db import open_store
from moetune.service.app import create_app
from moetune.service.jobs_api import MAX_BODY_BYTES
from moetune.service.settings import ServiceSettings
from tests.service.local_client import local_client

TOKEN = "t" * 24
WRITE = {"Authorization": f"Bearer {TOKEN}"}
PROBLEM = "m=16,k=64,n=256,g=4,dtype=bf16"
SPEC = {"problems": [PROBLEM], "backend": "xla", "budget": 4, "baseline": False}


def client(db_url: str) -> TestClient:
    return local_client(create_app(ServiceSettings(db_url=db_url, token=TOKEN)))


def _jobs(db_url: str) -> list:
    with open_store(db_url) as store:
        return store.jobs()


def test_submit_list_show_cancel_and_a_restart_keeps_every_job(db_url):
    with client(db_url) as c:
        made = c.post("/api/jobs", json=SPEC | {"priority": 4, "device_kind": "cpu"}, headers=WRITE)
        assert made.status_code == 201, made.text
        job = made.json()
        assert (job["state"], job["priority"], job["device_kind"]) == ("queued", 4, "cpu")
        assert job["spec"]["problems"] == [PROBLEM] and job["spec"]["db"] is None
        second = c.post("/api/jobs", json={"model": "mixtral-8x7b"}, headers=WRITE).json()
        assert c.post(f"/api/jobs/{second['id']}/cancel", headers=WRITE).json()["state"] == "cancelled"
    with client(db_url) as c:  # a new server on the same database
        listed = c.get("/api/jobs").json()
        assert [(j["id"], j["state"]) for j in listed] == [(second["id"], "cancelled"), (job["id"], "queued")]
        assert [j["id"] for j in c.get("/api/jobs", params={"state": "queued"}).json()] == [job["id"]]
        assert c.get(f"/api/jobs/{job['id']}").json()["spec"]["budget"] == 4
        again = c.post(f"/api/jobs/{second['id']}/cancel", headers=WRITE)
        assert again.status_code == 400 and "ended already" in again.json()["detail"]
        assert c.get("/api/jobs/999").status_code == 404
        assert c.get(f"/api/jobs/{2**40}").status_code == 422


@pytest.mark.parametrize("route", ["/api/jobs", "/api/jobs/1/cancel"])
def test_writes_need_the_token(sqlite_url, route):
    with open_store(sqlite_url) as store:
        store.submit_job({"problems": [PROBLEM]})
    with client(sqlite_url) as c:
        assert c.post(route, json=SPEC).status_code == 401
    assert [j.state for j in _jobs(sqlite_url)] == ["queued"]


@pytest.mark.parametrize(
    "body, message",
    [
        ({"problems": ["m=bad"]}, "missing k, n, g"),
        (SPEC | {"budget": 0}, "budget=0"),
        ({"backend": "xla"}, "nothing to tune"),
        (SPEC | {"strategy": "nosuch"}, "unknown strategy"),
        (SPEC | {"colour": "red"}, "unknown sweep fields colour"),
        (SPEC | {"db": "postgresql://u:secret@h/db"}, "drop db"),
        ({"models": ["my-model.yaml"]}, "shipped models"),
        (SPEC | {"routing": "balanced,ids.npy"}, "routing file"),
        (SPEC | {"priority": "high"}, "priority"),
        (SPEC | {"device_kind": ""}, "device_kind"),
        ([PROBLEM], "JSON object"),
    ],
)
def test_a_spec_submit_would_refuse_is_one_line_400_and_writes_nothing(sqlite_url, body, message):
    with client(sqlite_url) as c:
        response = c.post("/api/jobs", json=body, headers=WRITE)
    assert response.status_code == 400 and message in response.json()["detail"], response.text
    assert "\n" not in response.json()["detail"] and "secret" not in response.text
    assert _jobs(sqlite_url) == []


def test_a_body_over_the_bound_or_not_json_is_refused(sqlite_url):
    padded = json.dumps(SPEC | {"space": {"pad": ["x" * MAX_BODY_BYTES]}})
    with client(sqlite_url) as c:
        assert c.post("/api/jobs", content=padded, headers=WRITE).status_code == 413
        chunks = (padded[i : i + 4096].encode() for i in range(0, len(padded), 4096))  # no Content-Length
        assert c.post("/api/jobs", content=chunks, headers=WRITE).status_code == 413
        broken = c.post("/api/jobs", content=b"{not json", headers=WRITE)
        assert broken.status_code == 400 and "not JSON" in broken.json()["detail"]
    assert _jobs(sqlite_url) == []
