"""What a server must never give away or let through: a database password (in any response, the
OpenAPI schema, an error, or its log), reads when they are protected, writes without the token."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from moetune.service.app import create_app
from moetune.service.settings import ServiceSettings
from tests.pgpass import pgpass_password
from tests.service.live_server import TOKEN
from tests.service.local_client import local_client
from tests.service.seeds import FP, MISSED, seed

REPO = Path(__file__).resolve().parents[2]
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _requests(sweep_id: int) -> list[tuple[str, str, dict]]:
    """(method, path, options): every route, with good and bad input, and the errors a client can cause."""
    kind = FP.device_kind
    miss = {"device": FP.to_dict(), "backend": "xla", "problem": MISSED.to_dict()}
    return [
        ("GET", "/api/health", {}),
        ("GET", "/openapi.json", {}),
        ("GET", "/docs", {}),
        ("GET", "/api/winners", {}),
        ("GET", "/api/winners?backend=nope", {}),
        ("GET", "/api/winners?m=0", {}),
        ("GET", "/api/winners/stale", {}),
        ("GET", f"/api/packs/{kind}/xla", {}),
        ("GET", "/api/packs/NVIDIA H200/xla", {}),
        ("GET", "/api/sweeps", {}),
        ("GET", f"/api/sweeps/{sweep_id}", {}),
        ("GET", "/api/sweeps/999", {}),
        ("GET", f"/api/sweeps/{sweep_id}/trials?limit=2", {}),
        ("GET", "/api/misses", {}),
        ("GET", "/api/jobs", {}),
        ("GET", "/api/jobs/999", {}),
        ("GET", "/api/jobs/999/log", {}),
        ("GET", f"/api/sweeps/{sweep_id}/progress", {}),
        ("GET", "/metrics", {}),
        ("GET", "/api/nothing-here", {}),
        ("POST", "/api/jobs", {"json": {"models": ["tiny"]}}),
        ("POST", "/api/jobs", {"json": {"models": ["no-such-model"]}, "headers": AUTH}),
        ("POST", "/api/jobs/999/cancel", {"headers": AUTH}),
        ("POST", "/api/misses", {"json": {"misses": [miss]}}),
        ("POST", "/api/misses", {"json": {"misses": [miss]}, "headers": AUTH}),
        ("POST", "/api/misses", {"content": b"{", "headers": AUTH}),
    ]


@pytest.mark.postgres
def test_a_database_password_is_in_no_response_and_no_log_line(postgres_url, tmp_path):
    url = sa.make_url(postgres_url)
    if url.password is None:  # from the pgpass file libpq reads, or any: a trusting server ignores it
        url = url.set(password=pgpass_password(url) or uuid.uuid4().hex)
    secret_url = url.render_as_string(hide_password=False)
    # Not the password alone: CI's is the role's name, `moetune`, which many responses hold.
    needles = [secret_url, f"{url.username}:{url.password}@", f"password={url.password}"]
    seeded = seed(secret_url)

    port, log = _free_port(), tmp_path / "server.log"
    env = os.environ | {
        "MOETUNE_DB": secret_url,
        "MOETUNE_SERVER_TOKEN": TOKEN,
        "XDG_DATA_HOME": str(tmp_path),
    }
    command = [sys.executable, "-m", "moetune.cli", "serve", "--port", str(port)]
    with log.open("w") as out:
        server = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=10) as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    client.get("/api/health")
                    break
                except httpx.TransportError:
                    assert server.poll() is None and time.monotonic() < deadline, log.read_text()
                    time.sleep(0.1)
            answers = [client.request(m, p, **o) for m, p, o in _requests(seeded.sweep_id)]
            statuses = [a.status_code for a in answers]
            assert {200, 304, 400, 401, 404, 422} - {304} <= set(statuses)
            # The database fails under the server: its error names the URL, masked.
            engine = sa.create_engine(postgres_url)
            with engine.begin() as connection:
                connection.execute(sa.text("ALTER TABLE sweeps RENAME TO sweeps_gone"))
            engine.dispose()
            failed = client.get("/api/sweeps")
            assert failed.status_code == 503 and ":***@" in failed.json()["detail"]
            answers.append(failed)
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=30)
    texts = {f"{a.request.method} {a.request.url.path}": repr(a.headers) + a.text for a in answers}
    texts["log"] = log.read_text()
    assert "GET /api/sweeps" in texts["log"]  # the access log was on
    leaks = [(where, needle) for where, text in texts.items() for needle in needles if needle in text]
    assert leaks == []


def test_protected_reads_refuse_every_read_route_without_the_token(sqlite_url):
    seeded = seed(sqlite_url)
    app = create_app(ServiceSettings(db_url=sqlite_url, token=TOKEN, protect_reads=True))
    read_paths = ("/api/", "/metrics")
    reads = [(m, p, o) for m, p, o in _requests(seeded.sweep_id) if m == "GET" and p.startswith(read_paths)]
    # Every read route of the schema is asked, its path parameters filled in.
    filled = {"{device_kind}": FP.device_kind, "{backend}": "xla", "{sweep_id}": str(seeded.sweep_id)}
    filled["{job_id}"] = "999"
    routes = set()
    for path, methods in app.openapi()["paths"].items():
        for placeholder, value in filled.items():
            path = path.replace(placeholder, value)
        routes |= {path} if "get" in methods else set()
    assert routes <= {p.split("?")[0] for _, p, _ in reads}
    with local_client(app) as client:
        for method, path, _ in reads:
            if path == "/api/nothing-here":
                continue
            assert client.request(method, path).status_code == 401, path
            assert client.request(method, path, headers=AUTH).status_code != 401, path
