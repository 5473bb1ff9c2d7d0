"""The local Ray cluster a sweep starts when it joins none: on loopback only, behind a token only its user
can read, without the database's secrets, and gone when its driver goes.

    driver (this process)                        keeper (tuner/cluster_keeper.py, its own session)
      start() ─── spawns, environment: cluster_env() ──►  ray.init(): GCS, raylet, agents, workers
      ray.init(address) ◄── "address 127.0.0.1:PORT" ───
      holds the keeper's stdin; closes it on stop(),       end of file -> every Ray process is stopped
      and the kernel closes it if the driver dies

Loopback. Ray 2.60 replaces a loopback node address (`_node_ip_address="127.0.0.1"`, or 127.0.0.1 in
`ray.init(address=...)`) by the machine's network address, and its servers then bind to every interface
(the GCS, the raylet's node and object managers, the core worker of every worker and driver) or to that
address (the runtime-env agent); the dashboard agent's servers, which a minimal install does not start,
follow the same rule in its source. Its single-machine mode keeps the node on loopback, and then each
of them binds to loopback: RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, its default on macOS and Windows, read
once, when Ray is imported. So this process needs it before its first `import ray`, and so does the
keeper (it inherits it); the keeper checks the result (tuner/cluster_keeper.py).

Token. A cluster that ray.init() starts requires a token, and Ray writes a new one to ~/.ray/auth_token
with the umask's mode (0644: every user of the machine can read it), and warns at every start that token
authentication is on. moetune names its own token file in RAY_AUTH_TOKEN_PATH, created 0600, and sets
RAY_AUTH_MODE=token itself, which is what Ray reads, and what keeps it from warning.

Secrets. Ray's processes and workers inherit the environment of the process that starts them, so the
keeper gets this one's without $MOETUNE_DB, PGPASSWORD or any URL that carries a password: the driver
alone writes to the database (tuner/ray_pool.py `worker_env` passes workers nothing of it either).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import selectors
import stat
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from moetune.db import urls
from moetune.kernels.errors import MoetuneError

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
AUTH_MODE_ENV = "RAY_AUTH_MODE"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
# Variables of the driver that no Ray process gets, whatever they hold (PGPASSWORD: libpq's password).
SECRET_ENV = frozenset({urls.ENV_DB, "PGPASSWORD"})
TOKEN_FILE = "ray-auth-token"
# ray.init() on a busy node takes seconds; minutes mean something is wrong.
START_TIMEOUT_S = 300.0
# The keeper stops the cluster in a few seconds (tuner/cluster_keeper.py).
STOP_TIMEOUT_S = 30.0


class LocalClusterError(MoetuneError):
    """moetune will not start a local Ray cluster here (it would not stay private), or it did not start."""


@dataclasses.dataclass
class LocalCluster:
    """A running local cluster: its GCS address, and the keeper that takes it down."""

    address: str
    keeper: subprocess.Popen

    def stop(self) -> None:
        """Take the cluster down and wait until the keeper has: it kills every Ray process when its stdin
        closes, or on SIGTERM (a keeper still inside ray.init() reads no stdin)."""
        if self.keeper.stdin is not None and not self.keeper.stdin.closed:
            self.keeper.stdin.close()
        try:
            self.keeper.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.keeper.terminate()
            try:
                self.keeper.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.keeper.kill()
                self.keeper.wait()


def start(num_cpus: int, object_store_bytes: int) -> LocalCluster:
    """Start a cluster of `num_cpus` CPUs on this machine (and the GPUs Ray finds), through a keeper."""
    prepare_driver()
    keeper = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "moetune.tuner.cluster_keeper",
            f"--num-cpus={num_cpus}",
            f"--object-store-bytes={object_store_bytes}",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=cluster_env(os.environ),
        # Its own session: a Ctrl-C at the terminal reaches the driver, which stops the sweep and then the
        # cluster, rather than the cluster under a sweep still running.
        start_new_session=True,
        text=True,
    )
    kind, _, text = _first_line(keeper).partition(" ")
    if kind == "address":
        return LocalCluster(text, keeper)
    LocalCluster(text, keeper).stop()
    raise LocalClusterError(text or f"the local Ray cluster did not start (exit code {keeper.returncode})")


def prepare_driver() -> None:
    """Give this process Ray's settings for a loopback cluster with a private token before it imports Ray,
    which reads them once; refuse when Ray was imported without them. They stay set: Ray keeps them."""
    if os.environ.get(LOOPBACK_ENV, "0") != "0":
        raise LocalClusterError(
            f"{LOOPBACK_ENV}={os.environ[LOOPBACK_ENV]} makes Ray address this machine by its network "
            "address, so a local cluster would listen on every interface; unset it, or pass --ray-address"
        )
    if "ray" in sys.modules:
        unset = [name for name in (LOOPBACK_ENV, AUTH_MODE_ENV) if name not in os.environ]
        if unset:
            raise LocalClusterError(
                f"Ray was imported before moetune could set {' and '.join(unset)}, which Ray reads once, at "
                "import, and without which a local cluster would listen on every interface; set "
                f"{LOOPBACK_ENV}=0 and {AUTH_MODE_ENV}=token before importing ray, or pass --ray-address"
            )
    # A token path set earlier (by the user, or by this function for an earlier cluster) stays: Ray caches
    # the token it read.
    token = Path(os.environ.get(TOKEN_PATH_ENV) or default_token_path())
    ensure_private_token(token)
    os.environ[LOOPBACK_ENV] = "0"
    os.environ.setdefault(AUTH_MODE_ENV, "token")
    os.environ[TOKEN_PATH_ENV] = str(token)


def cluster_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The keeper's environment, and so every Ray process's and worker's: `environ` without secrets."""
    return {
        name: value
        for name, value in environ.items()
        if name not in SECRET_ENV and not urls.has_password(value)
    }


def default_token_path() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("moetune")) / TOKEN_FILE


def ensure_private_token(path: Path) -> None:
    """A token file only its owner can read: created 0600 with a new token, or refused if it is not."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise LocalClusterError(
                f"Ray's token file {path} is readable by other users (mode {mode:o}); chmod 600 it"
            ) from None
        return
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))  # 256 bits, as Ray's own generator


def _first_line(keeper: subprocess.Popen) -> str:
    """The keeper's report; "" if it exits, or says nothing within START_TIMEOUT_S."""
    with selectors.DefaultSelector() as selector:
        selector.register(keeper.stdout, selectors.EVENT_READ)
        if not selector.select(timeout=START_TIMEOUT_S):
            return f"error the local Ray cluster did not start within {START_TIMEOUT_S:g}s"
    return keeper.stdout.readline().strip()
