"""The app's frame: a fresh database is migrated on start, /api/health answers, errors are one-line JSON,
reads are open unless protected, writes always need the token, and no CORS header unless configured."""

from __future__ import annotations

import pytest
from fastapi import Depends
from fastapi.testclient import TestClient

from moetune.service.app import create_app
from moetune.service.auth import require_token
from moetune.service.settings import ServiceSettings
from tests.service.local_client import local_client

TOKEN = "t" * 24


def client(tmp_path, **settings) -> TestClient:
    app = create_app(ServiceSettings(db_url=f"sqlite:///{tmp_path / 'moetune.db'}", token=TOKEN, **settings))

    @app.post("/api/echo", dependencies=[Depends(require_token)])
    def echo() -> dict[str, bool]:
        return {"ok": True}

    return local_client(app)


def test_health_answers_with_the_migrated_schema(tmp_path):
    with client(tmp_path) as c:
        body = c.get("/api/health").json()
    assert body["status"] == "ok" and body["database"] == "sqlite" and body["revision"]


@pytest.mark.parametrize("header", [None, "Bearer wrong-token-wrong-token", f"Basic {TOKEN}", TOKEN])
def test_a_write_without_the_token_is_refused(tmp_path, header):
    with client(tmp_path) as c:
        response = c.post("/api/echo", headers={"Authorization": header} if header else {})
    assert response.status_code == 401 and "Bearer" in response.json()["detail"]


def test_a_write_with_the_token_passes(tmp_path):
    with client(tmp_path) as c:
        assert c.post("/api/echo", headers={"Authorization": f"Bearer {TOKEN}"}).json() == {"ok": True}


def test_protected_reads_need_the_token(tmp_path):
    with client(tmp_path, protect_reads=True) as c:
        assert c.get("/api/health").status_code == 401
        assert c.get("/api/health", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_no_cors_header_unless_an_origin_is_configured(tmp_path):
    origin = {"Origin": "http://elsewhere.example"}
    with client(tmp_path) as c:
        assert "access-control-allow-origin" not in c.get("/api/health", headers=origin).headers
    with client(tmp_path, cors_origins=("http://elsewhere.example",)) as c:
        allowed = c.get("/api/health", headers=origin).headers
    assert allowed["access-control-allow-origin"] == "http://elsewhere.example"


def test_the_openapi_schema_documents_the_api(tmp_path):
    with client(tmp_path) as c:
        schema = c.get("/openapi.json").json()
    assert "/api/health" in schema["paths"] and schema["info"]["title"] == "moetune"


def test_a_short_token_is_refused():
    with pytest.raises(ValueError):
        ServiceSettings(token="short")
