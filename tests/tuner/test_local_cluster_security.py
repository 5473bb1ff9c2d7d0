"""The local Ray cluster a sweep starts (tuner/local_cluster.py, tuner/cluster_keeper.py), looked at from
outside. A driver in a child process (tests/tuner/cluster_driver.py) starts it as a sweep does; the tests
read its processes' sockets, environments and token file, kill the driver, and run a real sweep with a
database password in $MOETUNE_DB, then look for that password in everything Ray recorded.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from moetune.tuner import local_cluster, ray_pool
from tests.pgpass import pgpass_password
from tests.tuner.cluster_driver import MARK_ENV

REPO = Path(__file__).resolve().parents[2]
# Starting a cluster takes seconds on a small machine; a killed driver's cluster must be gone in a few.
START_TIMEOUT_S = 240
GONE_WITHIN_S = 10.0


def driver_env(home: Path, **extra: str) -> dict[str, str]:
    """A child driver's environment: this one's without Ray settings (an earlier cluster of this test
    process set some), a home of its own (where Ray would write its default token), and a fresh mark."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("RAY_")}
    home.mkdir(parents=True, exist_ok=True)
    return env | {"HOME": str(home), "XDG_DATA_HOME": str(home / "data"), MARK_ENV: uuid.uuid4().hex} | extra


def start_driver(tmp: Path, env: dict[str, str]) -> tuple[subprocess.Popen, dict]:
    """A child driver holding a local cluster, and what it saw once a worker was up."""
    out = tmp / "evidence.json"
    driver = subprocess.Popen(
        [sys.executable, "-m", "tests.tuner.cluster_driver", str(out)],
        cwd=REPO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=(tmp / "stderr.txt").open("w"),
        text=True,
    )
    if driver.stdout.readline().strip() != "ready":
        driver.kill()
        driver.wait()
        pytest.fail(f"the driver did not start a cluster:\n{(tmp / 'stderr.txt').read_text()[-3000:]}")
    return driver, json.loads(out.read_text())


@pytest.fixture(scope="module")
def held(tmp_path_factory):
    """One cluster, held by a child driver for the tests that only look."""
    tmp = tmp_path_factory.mktemp("held")
    driver, evidence = start_driver(tmp, driver_env(tmp / "home"))
    yield tmp, evidence
    driver.stdin.close()
    driver.wait(timeout=60)


def is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def listening_ports() -> set[int]:
    """Every port some socket of this machine listens on (TCP, IPv4 and IPv6)."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A":  # TCP_LISTEN
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def alive(pid: int) -> bool:
    """The process runs (a zombie has exited: it holds no socket and waits only to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def marked(mark: str) -> list[int]:
    """The running processes that carry `mark` in their environment."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if f"{MARK_ENV}={mark}".encode() in environ.split(b"\0") and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


# --- on loopback, behind a private token, quietly --------------------------------------------------


@pytest.mark.slow
def test_every_listening_socket_of_the_cluster_is_on_loopback(held):
    _, evidence = held
    sockets = [(p["name"], ip, port) for p in evidence["processes"] for ip, port in p["listening"]]
    servers = {name for name, _, _ in sockets}
    assert {"gcs_server", "raylet"} <= servers, sockets  # the scan saw the cluster's servers
    assert any(name.startswith("ray::") for name in servers), sockets  # and a worker's
    assert [s for s in sockets if not is_loopback(s[1])] == []


@pytest.mark.slow
def test_the_token_file_only_its_owner_can_read(held):
    tmp, evidence = held
    environs = [p["environ"] for p in evidence["processes"] if p["name"] in ("gcs_server", "raylet")]
    assert environs and all(e.get("RAY_AUTH_MODE") == "token" for e in environs)  # the cluster needs one
    named = {e["RAY_AUTH_TOKEN_PATH"] for e in environs if "RAY_AUTH_TOKEN_PATH" in e}
    default = tmp / "home" / ".ray" / "auth_token"  # where Ray writes one itself
    files = [Path(path) for path in named] + ([default] if default.exists() else [])
    assert files
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, f"{path} mode {path.stat().st_mode:o}"


@pytest.mark.slow
def test_ray_does_not_warn_that_token_authentication_is_on(held):
    tmp, _ = held
    assert "Token authentication is enabled" not in (tmp / "stderr.txt").read_text()


# --- gone with the driver ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_killed_drivers_cluster_is_gone_within_seconds(tmp_path):
    env = driver_env(tmp_path / "home")
    driver, evidence = start_driver(tmp_path, env)
    pids = {p["pid"] for p in evidence["processes"]} - {driver.pid}
    ports = {port for p in evidence["processes"] for _, port in p["listening"]}
    assert len(pids) >= 4 and ports  # GCS, raylet, agents, a worker: the cluster was there to kill
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    deadline = time.monotonic() + GONE_WITHIN_S
    while time.monotonic() < deadline and ([p for p in pids if alive(p)] or marked(env[MARK_ENV])):
        time.sleep(0.2)
    left = sorted(set(p for p in pids if alive(p)) | set(marked(env[MARK_ENV])))
    assert left == [], [Path(f"/proc/{p}/cmdline").read_bytes()[:80] for p in left if alive(p)]
    assert ports & listening_ports() == set()


# --- refusals ---------------------------------------------------------------------------------------


def network_address() -> str | None:
    """The address this machine would reach the network from (what Ray calls the node's IP), if any."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent, the route is only looked up
        except OSError:
            return None
        return probe.getsockname()[0]


@pytest.mark.slow
def test_the_keeper_refuses_a_cluster_that_listens_beyond_loopback(tmp_path):
    """In Ray's cluster mode its servers bind to every interface: the keeper says where and stops."""
    if network_address() in (None, "0.0.0.0") or is_loopback(network_address()):
        pytest.skip("this machine has no network address, so Ray binds to loopback in any mode")
    env = driver_env(tmp_path / "home", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="1", RAY_AUTH_MODE="disabled")
    command = [sys.executable, "-m", "moetune.tuner.cluster_keeper", "--num-cpus=1", "--object-store-bytes"]
    keeper = subprocess.run(
        [*command, str(ray_pool.OBJECT_STORE_BYTES)],
        env=env,
        input="",
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
    )
    assert keeper.returncode == 1, keeper.stderr[-3000:]
    assert keeper.stdout.startswith("error the local Ray cluster listens beyond loopback ("), keeper.stdout
    assert "gcs_server" in keeper.stdout and "--ray-address" in keeper.stdout


def test_ray_imported_without_moetune_settings_is_refused(monkeypatch):
    """Ray reads its loopback and token settings when imported: too late to set them after."""
    monkeypatch.setitem(sys.modules, "ray", sys.modules.get("ray", object()))
    monkeypatch.delenv(local_cluster.LOOPBACK_ENV, raising=False)
    monkeypatch.delenv(local_cluster.AUTH_MODE_ENV, raising=False)
    with pytest.raises(local_cluster.LocalClusterError, match="Ray was imported before moetune could set"):
        local_cluster.prepare_driver()


def test_ray_cluster_mode_is_refused(monkeypatch):
    monkeypatch.setenv(local_cluster.LOOPBACK_ENV, "1")
    with pytest.raises(local_cluster.LocalClusterError, match="listen on every interface.*--ray-address"):
        local_cluster.prepare_driver()


def test_token_file_is_created_private_and_kept(tmp_path):
    path = tmp_path / "fresh" / "token"
    local_cluster.ensure_private_token(path)
    token = path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(token) == 64
    local_cluster.ensure_private_token(path)
    assert path.read_text() == token  # the next cluster uses the same one: the driver's Ray caches it


def test_a_token_file_others_can_read_is_refused(tmp_path):
    path = tmp_path / "token"
    path.write_text("0" * 64)
    path.chmod(0o644)
    with pytest.raises(local_cluster.LocalClusterError, match="readable by other users .*chmod 600"):
        local_cluster.ensure_private_token(path)


# --- no database secret in Ray ----------------------------------------------------------------------


def test_the_cluster_environment_leaves_out_database_secrets():
    environ = {
        "MOETUNE_DB": "sqlite:///x.db",  # whatever it holds: workers never need the database
        "PGPASSWORD": "pw",
        "SOME_DATABASE_URL": "postgresql://u:pw@h/db",
        "ANOTHER_URL": "postgresql://u@h/db?password=pw",
        "PATH": "/usr/bin",
        "PYTHONPATH": "/src",
        "JAX_PLATFORMS": "cpu",
        "SERVICE": "https://example.org/api",
    }
    assert local_cluster.cluster_env(environ) == {
        "PATH": "/usr/bin",
        "PYTHONPATH": "/src",
        "JAX_PLATFORMS": "cpu",
        "SERVICE": "https://example.org/api",
    }


def test_workers_get_no_database_url(monkeypatch):
    monkeypatch.setenv("MOETUNE_DB", "postgresql+psycopg://moetune:pw@127.0.0.1/db")
    monkeypatch.setenv("PGPASSWORD", "pw")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    env = ray_pool.worker_env()
    assert env["JAX_PLATFORMS"] == "cpu"
    assert "MOETUNE_DB" not in env and "PGPASSWORD" not in env
    assert not any("pw" in value for value in env.values())


@pytest.mark.slow
@pytest.mark.postgres
def test_a_password_in_moetune_db_reaches_nothing_ray_records(postgres_url, tmp_path):
    """A real sweep (the tiny model on xla) with the database URL, password and all, in $MOETUNE_DB: it is
    in no Ray table, log, worker command line or worker environment; only the driver has it.

    Searched for: the URL, its `user:password@` part, and a mark of its own (application_name), which a
    copy of any part of the URL's query would carry. Not the password alone: CI's is the role's name,
    `moetune`, which every moetune command line holds."""
    mark = f"moetune-test-{uuid.uuid4().hex}"
    url = sa.make_url(postgres_url).update_query_dict({"application_name": mark})
    if url.password is None:
        # The password from the pgpass file libpq reads (as CI passes it), or any: a server that trusts
        # local connections ignores it.
        url = url.set(password=pgpass_password(url) or uuid.uuid4().hex)
    secret_url = url.render_as_string(hide_password=False)
    needles = [secret_url, f"{url.username}:{url.password}@", mark]

    out = tmp_path / "evidence.json"
    env = driver_env(tmp_path / "home", MOETUNE_DB=secret_url)
    args = ["tune", "--model", "tiny", "--buckets", "8", "--backend", "xla", "--budget", "2"]
    run = subprocess.run(
        [sys.executable, "-m", "tests.tuner.cluster_driver", str(out), *args, "--workers", "1", "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    outcome = json.loads(run.stdout[run.stdout.index("{") :])
    from moetune.db import open_store

    with open_store(postgres_url) as store:
        assert store.trials(sweep_id=outcome["sweep_id"])  # the sweep wrote to the database in MOETUNE_DB

    evidence = json.loads(out.read_text())
    others = [p for p in evidence["processes"] if p["pid"] != evidence["driver"]]
    driver = [p for p in evidence["processes"] if p["pid"] == evidence["driver"]]
    workers = [p for p in others if p["name"].startswith("ray::") and MARK_ENV in p["environ"]]
    assert driver and workers  # the environments of the driver and of a worker were read
    assert all("MOETUNE_DB" not in p["environ"] for p in others)
    seen = {
        "tables": json.dumps(evidence["tables"]),
        "command lines": json.dumps([p["cmdline"] for p in evidence["processes"]]),
        "environments": json.dumps([p["environ"] for p in others]),
    }
    session = next(
        arg.split("=", 1)[1]
        for p in others
        if p["name"] == "gcs_server"
        for arg in p["cmdline"]
        if arg.startswith("--session-dir=")
    )
    logs = [f for f in Path(session).rglob("*") if f.is_file()]
    assert logs
    seen |= {str(f): f.read_bytes().decode(errors="replace") for f in logs}
    leaks = [(where, needle) for where, text in seen.items() for needle in needles if needle in text]
    assert leaks == []
