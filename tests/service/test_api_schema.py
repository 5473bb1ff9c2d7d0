"""The API describes itself correctly: every route has a response model and its OpenAPI schema is that
model (a list route: an array of its item model), every body has a schema, the bearer scheme is
declared; /docs and /redoc load only this server's files; /metrics is Prometheus' text format."""

from __future__ import annotations

import re
import typing

import pytest
from fastapi.routing import APIRoute
from prometheus_client.parser import text_string_to_metric_families

from moetune.db import open_store
from moetune.service.app import create_app
from moetune.service.settings import ServiceSettings
from tests.service.local_client import local_client
from tests.service.seeds import seed

TOKEN = "t" * 24


@pytest.fixture
def client(sqlite_url):
    seed(sqlite_url)
    with local_client(create_app(ServiceSettings(db_url=sqlite_url, token=TOKEN))) as c:
        yield c


def _api_routes(app) -> list[APIRoute]:
    """The app's own routes and its routers' (FastAPI keeps an included router as one entry)."""
    from moetune.service import jobs_api, metrics, misses_api, packs_api, sweeps_api, winners_api

    routes = [*app.routes]
    for module in (winners_api, packs_api, sweeps_api, misses_api, jobs_api, metrics):
        routes += module.router.routes
    found = [r for r in routes if isinstance(r, APIRoute) and r.include_in_schema]
    schema_paths = {(path, m.upper()) for path, ops in app.openapi()["paths"].items() for m in ops}
    assert {(r.path, m) for r in found for m in r.methods} == schema_paths  # none left out
    return found


def _ok(operation: dict) -> dict:
    responses = operation["responses"]
    return responses.get("200") or responses["201"]


def test_every_list_route_is_an_array_of_its_item_model(client):
    schema = client.get("/openapi.json").json()
    lists = 0
    for route in _api_routes(client.app):
        if route.path == "/metrics":
            continue
        assert route.response_model is not None, route.path
        (method,) = route.methods
        body = _ok(schema["paths"][route.path][method.lower()])["content"]["application/json"]["schema"]
        if typing.get_origin(route.response_model) is list:
            (item,) = typing.get_args(route.response_model)
            assert body["type"] == "array", route.path
            assert body["items"] == {"$ref": f"#/components/schemas/{item.__name__}"}, route.path
            lists += 1
        else:
            assert body == {"$ref": f"#/components/schemas/{route.response_model.__name__}"}, route.path
    assert lists >= 6  # winners, stale, sweeps, trials, misses, jobs


def test_every_body_has_a_schema_and_every_route_the_bearer_scheme(client):
    schema = client.get("/openapi.json").json()
    assert schema["components"]["securitySchemes"]["token"] == {
        "type": "http",
        "scheme": "bearer",
        "description": schema["components"]["securitySchemes"]["token"]["description"],
    }
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            assert operation.get("security") == [{"token": []}], (method, path)
            if method == "post" and not path.endswith("/cancel"):
                body = operation["requestBody"]["content"]["application/json"]["schema"]
                assert body.get("$ref") or body.get("properties"), path
    jobs = schema["paths"]["/api/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"models", "problems", "backend", "budget", "priority", "device_kind"} <= set(jobs["properties"])
    assert "db" not in jobs["properties"] and "ray_address" not in jobs["properties"]


def test_a_body_of_the_wrong_type_is_one_line_400(client):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    response = client.post("/api/jobs", json={"problems": "m=16", "budget": [1]}, headers=auth)
    assert response.status_code == 400 and "\n" not in response.json()["detail"]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_api_pages_load_only_this_servers_files(client, page):
    response = client.get(page)
    assert response.status_code == 200
    html = response.text
    assert "cdn" not in html.lower() and "googleapis" not in html
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html) + re.findall(r"url: ?'([^']+)'", html)
    assert urls and all(url.startswith("/") for url in urls), urls
    for url in urls:
        asset = client.get(url)
        assert asset.status_code == 200 and len(asset.content) > 100, url
    if page == "/docs":
        assert '"validatorUrl": null' in html


def test_an_asset_is_cached_and_revalidated_and_nothing_else_is_served(client):
    first = client.get("/static/docs/swagger-ui.css")
    assert (
        first.headers["content-type"].startswith("text/css") and "max-age" in first.headers["cache-control"]
    )
    again = client.get("/static/docs/swagger-ui.css", headers={"If-None-Match": first.headers["etag"]})
    assert again.status_code == 304 and again.content == b""
    assert client.get("/static/docs/..%2Fcore.py").status_code == 404
    assert client.get("/static/docs/core.py").status_code == 404


def test_metrics_are_prometheus_text_from_the_database(client, sqlite_url):
    with open_store(sqlite_url) as store:
        store.submit_job({"problems": ["m=16,k=64,n=256,g=4,dtype=bf16"]})
        store.submit_job({"problems": ["m=32,k=64,n=256,g=4,dtype=bf16"]})
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }
    assert samples[("moetune_jobs", (("state", "queued"),))] == 2
    assert samples[("moetune_jobs", (("state", "running"),))] == 0
    assert samples[("moetune_sweeps", (("status", "running"),))] == 0
    assert samples[("moetune_sweeps", (("status", "done"),))] == 1
    assert samples[("moetune_trials_total", (("status", "ok"),))] == 2
    assert samples[("moetune_trials_total", (("status", "compile_error"),))] == 1
    assert samples[("moetune_trials_last_minute", ())] == 3
    assert samples[("moetune_misses_total", ())] == 3
    assert samples[("moetune_missed_problems", ())] == 2
    assert samples[("moetune_winners_active", ())] == 2


def test_protected_reads_protect_metrics_and_the_api_pages(sqlite_url):
    settings = ServiceSettings(db_url=sqlite_url, token=TOKEN, protect_reads=True)
    with local_client(create_app(settings)) as c:
        for path in ("/metrics", "/docs", "/redoc", "/static/docs/swagger-ui.css"):
            assert c.get(path).status_code == 401, path
            assert c.get(path, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200, path
