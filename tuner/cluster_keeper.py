"""The process that owns a local Ray cluster for one driver, and takes all of it down when the driver goes.

    python -m moetune.tuner.cluster_keeper --num-cpus N --object-store-bytes B

    stdout  one line: "address HOST:PORT" once the cluster runs, else "error REASON"
    stdin   held open by the driver; end of file (the driver closed it, exited, or was killed)
            -> every process below the keeper is killed, and the keeper exits

tuner/local_cluster.py starts it and gives it its environment: the driver's without the database's
secrets, plus Ray's loopback and token settings. The keeper starts the cluster with ray.init(), so Ray's
processes are its children, and it is their subreaper (PR_SET_CHILD_SUBREAPER): the agents and workers
that the raylet started, orphaned when it dies, become the keeper's children rather than init's, so none
escapes. Without the keeper they outlive a killed driver by about a minute, still listening, before
they notice that their raylet is gone.

The keeper also refuses a cluster that listens anywhere but on loopback, in case a Ray version binds a
server to the machine's network address whatever the settings: it says where, and stops the cluster.
"""

from __future__ import annotations

import argparse
import ctypes
import ipaddress
import logging
import os
import signal
import sys
from typing import TextIO

# PR_SET_CHILD_SUBREAPER from <linux/prctl.h>.
_PR_SET_CHILD_SUBREAPER = 36
# Rounds of SIGKILL, each waiting this long for the processes to go: a round finds the ones started
# while the last was killing (a raylet spawning a worker).
_KILL_ROUNDS = 5
_KILL_WAIT_S = 2.0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m moetune.tuner.cluster_keeper")
    parser.add_argument("--num-cpus", type=int, required=True)
    parser.add_argument("--object-store-bytes", type=int, required=True)
    args = parser.parse_args(argv)
    import ray  # noqa: F401  first: it also makes psutil, which it ships, importable for the teardown

    # The driver reads one line from stdout; whatever else is printed there (Ray's own processes inherit
    # it) goes to stderr instead.
    report = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, lambda *_: _exit(0))
    _become_subreaper()
    try:
        address = _start(args.num_cpus, args.object_store_bytes)
        public = listeners_off_loopback()
    except Exception as e:  # the one place a failed start is reported: to the driver, in one line
        _say(report, "error", f"the local Ray cluster did not start: {' '.join(str(e).split())}")
        _exit(1)
    if public:
        _say(
            report,
            "error",
            f"the local Ray cluster listens beyond loopback ({', '.join(public)}), so moetune stopped "
            "it; start a cluster yourself and pass --ray-address",
        )
        _exit(1)
    _say(report, "address", address)
    while sys.stdin.buffer.read(4096):  # nothing is ever sent: only the end of the pipe matters
        pass
    _exit(0)


def _start(num_cpus: int, object_store_bytes: int) -> str:
    import ray

    ray.init(
        address="local",  # a new cluster, never one named by RAY_ADDRESS
        num_cpus=num_cpus,
        object_store_memory=object_store_bytes,
        include_dashboard=False,
        logging_level=logging.WARNING,
        log_to_driver=False,
    )
    return ray.get_runtime_context().gcs_address


def listeners_off_loopback() -> list[str]:
    """Every TCP socket the keeper's processes listen on outside loopback, as "ip:port (process)"."""
    import psutil  # Ray ships it (ray/thirdparty_files) and imports it itself

    keeper = psutil.Process()
    found = []
    for process in [keeper, *keeper.children(recursive=True)]:
        try:
            sockets = process.net_connections(kind="tcp")
            name = process.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        for s in sockets:
            if s.status == psutil.CONN_LISTEN and not is_loopback(s.laddr.ip):
                found.append(f"{s.laddr.ip}:{s.laddr.port} ({name})")
    return found


def is_loopback(ip: str) -> bool:
    """127.0.0.0/8, ::1, or an IPv4 loopback address on an IPv6 socket (::ffff:127.0.0.1)."""
    address = ipaddress.ip_address(ip.split("%", 1)[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _become_subreaper() -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def stop_descendants() -> None:
    """SIGKILL every process below this one, and reap them.

    Not SIGTERM first: Ray's GCS and raylet take seconds over it, and a sweep's cluster holds nothing to
    save (the driver has the results, in its database)."""
    import psutil

    keeper = psutil.Process()
    for _ in range(_KILL_ROUNDS):
        processes = keeper.children(recursive=True)
        if not processes:
            return
        for process in processes:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(processes, timeout=_KILL_WAIT_S)


def _exit(code: int) -> None:
    """Stop the cluster and leave without Ray's exit handlers, which would wait on the GCS just killed."""
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
    stop_descendants()
    os._exit(code)


def _say(report: TextIO, kind: str, text: str) -> None:
    try:
        report.write(f"{kind} {text}\n")
        report.flush()
    except OSError:  # the driver is gone before it heard back
        _exit(1)


if __name__ == "__main__":
    main()
