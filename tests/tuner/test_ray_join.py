"""Joining a cluster with --ray-address: bounded (ray_pool.JOIN_TIMEOUT_S), one line naming the address,
and a cluster on loopback joined as it is (Ray would replace 127.0.0.1 by the network address)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moetune.tuner import ray_pool

REPO = Path(__file__).resolve().parents[2]


def _child(code: str, *, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | (env or {})
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=environ, cwd=REPO
    )


def test_a_refused_address_is_one_line_at_once():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"  # bound, not listening: refused
        began = time.monotonic()
        with pytest.raises(ray_pool.PoolError, match=f"cannot join the Ray cluster at {address}: .*refused"):
            ray_pool.connect(address)
    assert time.monotonic() - began < 5


JOIN = """
import sys
from moetune.tuner import ray_pool
ray_pool.JOIN_TIMEOUT_S = {timeout}
try:
    ray_pool.connect({address!r})
except ray_pool.PoolError as e:
    print("error:", e, file=sys.stderr)
    sys.exit(2)
import ray
print("joined", int(ray.cluster_resources().get("CPU", 0)))
"""


@pytest.mark.slow
def test_an_address_that_never_answers_is_given_up_within_the_bound():
    with socket.socket() as silent:  # accepts connections (the backlog) and never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        code = JOIN.format(address=address, timeout=4)
        began = time.monotonic()
        done = _child(code, timeout=120)
    assert done.returncode == 2, done.stderr
    # Ray's C++ client may log its own retries (timestamped lines) first; moetune's error is one line.
    assert [line for line in done.stderr.splitlines() if not line.startswith("[")] == [
        f"error: cannot join the Ray cluster at {address}: no answer within 4 s (is it a Ray cluster's GCS "
        "address, and does it listen on an address this machine reaches?)"
    ]
    assert time.monotonic() - began < 60


@pytest.mark.slow
def test_a_cluster_on_loopback_is_joined_by_its_loopback_address(tmp_path):
    """The local cluster of one process (on loopback only), joined by another through --ray-address."""
    token = tmp_path / "token"
    env = {"RAY_AUTH_TOKEN_PATH": str(token), "XDG_DATA_HOME": str(tmp_path)}
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\nfrom moetune.tuner import local_cluster, ray_pool\nlocal_cluster.prepare_driver()\n"
            "c = local_cluster.start(1, ray_pool.OBJECT_STORE_BYTES)\nprint(c.address, flush=True)\n"
            "sys.stdin.read()\nc.stop()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | env,
        cwd=REPO,
    )
    try:
        address = holder.stdout.readline().strip()
        assert address.startswith("127.0.0.1:"), address
        done = _child(
            JOIN.format(address=address, timeout=60), timeout=120, env=env | {"RAY_AUTH_MODE": "token"}
        )
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert done.returncode == 0 and "joined 1" in done.stdout, done.stderr
