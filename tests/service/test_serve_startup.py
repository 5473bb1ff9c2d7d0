"""`moetune serve` checks its address before it creates anything: a port in use is one line on stderr,
exit 2, no database, no token file, no "serving" line; a wildcard CORS origin is refused the same way."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

TOKEN = "t" * 24


def _run(*args: str, tmp_path, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MOETUNE_DB", "MOETUNE_SERVER_TOKEN")}
    command = [sys.executable, "-m", "moetune.cli", "serve", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)


def _files(tmp_path) -> tuple[str, str]:
    return f"sqlite:///{tmp_path / 'moetune.db'}", str(tmp_path / "token")


def _started(tmp_path, *args: str, stderr=subprocess.PIPE) -> tuple[subprocess.Popen, str]:
    """`moetune serve ARGS` on a free loopback port, once its health route answers: (process, base URL).
    A server that exits or does not answer within a minute fails the test, and is ended."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    command = [sys.executable, "-m", "moetune.cli", "serve", "--port", str(port), *args]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=tmp_path)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                assert httpx.get(f"{base}/api/health", timeout=2).status_code == 200
                return server, base
            except httpx.TransportError:
                said = server.stderr.read() if server.poll() is not None and server.stderr else ""
                assert server.poll() is None and time.monotonic() < deadline, said
                time.sleep(0.2)
    except BaseException:
        server.kill()
        server.wait(timeout=30)
        raise


def test_a_port_in_use_is_one_line_exit_2_and_nothing_is_created(tmp_path):
    db, token = _files(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _run("--port", str(port), "--db", db, "--token-file", token, tmp_path=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().count("\n") == 0 and f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert result.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args, message",
    [
        (("--cors-origin", "*"), "CORS origin '*' is refused"),
        (("--allowed-host", "*.example"), "no wildcards"),
        # 192.0.2.1 (TEST-NET-1) is on no interface of this machine: the bind fails, nothing is sent.
        (("--host", "192.0.2.1"), "cannot listen on 192.0.2.1:1: Cannot assign requested address"),
    ],
)
def test_a_bad_address_or_origin_is_one_line_exit_2_and_nothing_is_created(tmp_path, args, message):
    db, token = _files(tmp_path)
    result = _run(*args, "--port", "1", "--db", db, "--token-file", token, tmp_path=tmp_path)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert result.stderr.strip().count("\n") == 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_server_answers_its_names_and_refuses_a_foreign_host(tmp_path):
    db, token = _files(tmp_path)
    server, base = _started(tmp_path, "--db", db, "--token-file", token, "--allowed-host", "tuner.internal")
    try:
        port = base.rsplit(":", 1)[1]
        for host, status in ((f"localhost:{port}", 200), ("tuner.internal", 200), ("evil.example", 400)):
            assert httpx.get(f"{base}/api/health", headers={"Host": host}).status_code == status, host
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=30)


@pytest.mark.slow
def test_several_server_processes_share_the_address_and_end_with_it(tmp_path):
    db, token = _files(tmp_path)
    args = ("--db", db, "--token-file", token, "--workers", "2")
    server, base = _started(tmp_path, *args, stderr=subprocess.DEVNULL)
    try:
        assert "2 processes" in server.stdout.readline()
        children = subprocess.run(["pgrep", "-P", str(server.pid)], capture_output=True, text=True)
        (child,) = children.stdout.split()
        # Each connection lands in one process or the other; both answer.
        for _ in range(20):
            assert httpx.get(f"{base}/api/jobs", headers={"Connection": "close"}).status_code == 200
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{child}")  # the second process ended with the first
