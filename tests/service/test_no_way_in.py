"""What a web page or a request must not get through: a foreign Host header (DNS rebinding), a wildcard
CORS origin, a job naming a file of the server (a path or an hf: reference, under `models` or `model`),
and an error quoting a file's contents. And `submit --hf-config` embeds the config, so no worker needs
its file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from typer.testing import CliRunner

from moetune.cli import _load_commands, app
from moetune.db import open_store
from moetune.service.app import create_app
from moetune.service.hosts import host_name
from moetune.service.settings import ServiceSettings
from moetune.tuner import hf_config, queue_spec
from tests.service.local_client import local_client

TOKEN = "t" * 24
WRITE = {"Authorization": f"Bearer {TOKEN}"}
HF_CONFIGS = Path(__file__).resolve().parents[1] / "tuner" / "hf_configs"


def _app(sqlite_url, **settings):
    return create_app(ServiceSettings(db_url=sqlite_url, token=TOKEN, **settings))


@pytest.mark.parametrize(
    "header, name",
    [("127.0.0.1:8765", "127.0.0.1"), ("[::1]:8765", "::1"), ("LocalHost", "localhost"), ("::1", "::1")],
)
def test_host_names_are_read_without_port_and_brackets(header, name):
    assert host_name(header) == name


@pytest.mark.parametrize("host", ["127.0.0.1:8765", "localhost:8765", "[::1]:8765", "localhost"])
def test_the_loopback_names_are_answered(sqlite_url, host):
    with TestClient(_app(sqlite_url)) as c:
        assert c.get("/api/health", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize("host", ["evil.example:8765", "evil.example", "127.0.0.1.evil.example", "", "[::1"])
@pytest.mark.parametrize("path", ["/api/health", "/api/winners", "/", "/openapi.json"])
def test_a_foreign_host_header_is_refused_before_any_route(sqlite_url, host, path):
    """A DNS-rebinding page reaches 127.0.0.1 under its own name, which its browser sends as Host."""
    with TestClient(_app(sqlite_url)) as c:
        response = c.get(path, headers={"Host": host})
    assert response.status_code == 400
    assert response.json()["detail"].startswith("host not allowed") and "evil" not in response.text


def test_a_configured_host_is_answered_and_the_loopback_ones_then_are_not(sqlite_url):
    with TestClient(_app(sqlite_url, allowed_hosts=("tuner.internal",))) as c:
        assert c.get("/api/health", headers={"Host": "tuner.internal:8765"}).status_code == 200
        assert c.get("/api/health", headers={"Host": "localhost:8765"}).status_code == 400


@pytest.mark.parametrize("origin", ["*", "null", "evil.example", "https://a.example/path"])
def test_a_wildcard_or_malformed_cors_origin_is_refused(origin):
    with pytest.raises(ValidationError, match="CORS origin"):
        ServiceSettings(token=TOKEN, cors_origins=(origin,))


@pytest.mark.parametrize("hosts", [(), ("*",), ("*.example",)])
def test_no_wildcard_or_empty_host_list(hosts):
    with pytest.raises(ValidationError):
        ServiceSettings(token=TOKEN, allowed_hosts=hosts)


SECRET = "contents-that-must-not-leak"


@pytest.mark.parametrize(
    "field",
    [
        {"models": ["mixtral-8x7b"], "model": "{path}"},
        {"model": "{path}"},
        {"models": ["{path}"]},
        {"models": ["hf:tp=1,ep=1:{path}"]},
        {"model": "hf:tp=1,ep=1:{path}"},
        {"models": ['hf:tp=1,ep=1:{{"model_type": "mixtral"}}']},
        {"models": [["nested"]]},
        {"models": "mixtral-8x7b", "model": 7},
    ],
)
def test_the_jobs_api_checks_every_model_and_reads_no_file(sqlite_url, tmp_path, field):
    secret = tmp_path / "model.yaml"
    secret.write_text(f"{SECRET}: [\n")  # neither a model nor valid YAML: an error would quote it
    body = json.loads(json.dumps(field).replace("{path}", str(secret)))
    with local_client(_app(sqlite_url)) as c:
        response = c.post("/api/jobs", json=body | {"backend": "xla", "budget": 2}, headers=WRITE)
    assert response.status_code == 400, response.text
    assert SECRET not in response.text and "\n" not in response.json()["detail"]
    with open_store(sqlite_url) as store:
        assert store.jobs() == []


@pytest.mark.parametrize("name", sorted(p.name for p in HF_CONFIGS.glob("*.json")))
def test_an_embedded_hf_config_reads_back_as_its_file(name):
    path = HF_CONFIGS / name
    embedded = hf_config.embedded(path, tp=1, ep=2)
    assert str(path) not in embedded and len(embedded) < 4096
    try:
        expected = hf_config.load_hf_config(path, ep=2)
    except Exception as e:  # a config the reader refuses is refused embedded too, with the same reason
        with pytest.raises(type(e)):
            hf_config.load_reference(embedded)
        return
    assert hf_config.load_reference(embedded) == expected


def test_submit_hf_config_embeds_the_json_so_the_worker_needs_no_file(sqlite_url, tmp_path):
    path = tmp_path / "config.json"
    shutil.copy(HF_CONFIGS / "mixtral-8x7b.json", path)
    _load_commands()
    args = ["submit", "--hf-config", str(path), "--backend", "xla", "--budget", "2", "--json"]
    result = CliRunner().invoke(app, args, env={"MOETUNE_DB": sqlite_url})
    assert result.exit_code == 0, result.output
    path.unlink()  # the worker's machine has no such file
    with open_store(sqlite_url) as store:
        (job,) = store.jobs()
    (model,) = job.spec["models"]
    assert model.startswith("hf:tp=1,ep=1:{") and str(tmp_path) not in json.dumps(job.spec)
    spec = queue_spec.of_job(job)
    from moetune.tuner.plan import load_model

    shapes = load_model(spec.models[0])
    assert (shapes.experts, shapes.top_k) == (8, 2)
    assert queue_spec.stored(spec)["models"] == [model]  # stored again (a re-queue): unchanged
