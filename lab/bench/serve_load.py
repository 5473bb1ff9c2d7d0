"""Load on the pack endpoint: N concurrent clients for S seconds against a `moetune serve` it starts on
loopback, over a database seeded with the shipped H200 pack; prints p50/p99/max latency, requests/s
and errors.

    python3 lab/bench/serve_load.py                     # 50 clients, 60 s, fresh fetches (200s)
    python3 lab/bench/serve_load.py --revalidate --json # clients send If-None-Match (304s)
    python3 lab/bench/serve_load.py --rate 10           # each client paced at 10 requests/s

Each client is one connection that asks again as soon as it has its answer (a closed loop), so
requests/s is what the server sustains and latency includes queueing behind the other clients; with
--rate each is paced instead, and latency counts from when a request was due. Client
and server share this machine's cores: on a small machine the numbers say as much about the client as
about the server. An error is any answer but 200 (304 with --revalidate) and any failed request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.resources
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import httpx

SHIPPED_PACK = "nvidia_h200__mosaic_gpu.json"
START_TIMEOUT_S = 60


def seed(url: str) -> tuple[str, str]:
    """The shipped pack's winners, promoted in the database at `url`: (device_kind, backend). Written as
    trials and promoted rather than through `moetune import`, whose check of every config against its
    backend's search space would take longer than a short run."""
    from moetune.db import open_store
    from moetune.db.records import TrialRecord
    from moetune.kernels import packs

    resource = importlib.resources.files("moetune.configs") / "tuned" / SHIPPED_PACK
    with importlib.resources.as_file(resource) as path:
        pack = packs.load(path)
    with open_store(url) as store:
        for entry in pack.entries:
            median = entry.median_s or 1e-3
            trial = TrialRecord(
                sweep_id=None,
                device=pack.device,
                backend=pack.backend,
                family="",
                source_hash=pack.kernel_source_hash,
                problem=entry.problem,
                config=entry.config,
                status="ok",
                samples_s=(median,),
                median_s=median,
            )
            store.promote(store.record_trial(trial), reason=f"from {SHIPPED_PACK}")
    return pack.device.device_kind, pack.backend


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def server(url: str) -> Iterator[str]:
    """`moetune serve` on a free loopback port, in a process of its own; its base URL."""
    port = _free_port()
    env = os.environ | {"MOETUNE_SERVER_TOKEN": secrets.token_urlsafe(24)}
    command = [sys.executable, "-m", "moetune.tuner.cli", "serve", "--db", url, "--port", str(port)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                httpx.get(base + "/api/health", timeout=1).raise_for_status()
                break
            except httpx.TransportError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the server did not start: {process.stderr.read()[-2000:]}") from None
                time.sleep(0.1)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)


async def _client(
    client: httpx.AsyncClient,
    path: str,
    until: float,
    revalidate: bool,
    results: dict,
    rate: float | None,
    phase: float = 0.0,
) -> None:
    headers: dict[str, str] = {}
    expected = 200
    # Paced clients start out of step (phase: a fraction of one interval), as independent processes
    # would; in step, all of them would ask in the same instant and measure a burst.
    scheduled = time.perf_counter() + (phase / rate if rate else 0.0)
    while time.perf_counter() < until:
        if rate:
            # Paced: a request is due every 1/rate s, and its latency counts from when it was due, so a
            # slow answer that delays the next request is counted against the server (no coordinated
            # omission).
            scheduled += 1.0 / rate
            await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
            started = scheduled
        else:
            started = time.perf_counter()
        try:
            response = await client.get(path, headers=headers)
            status = response.status_code
        except httpx.HTTPError:
            status = None
        results["latencies_s"].append(time.perf_counter() - started)
        if status != expected:
            results["errors"] += 1
        elif revalidate and status == 200:
            headers, expected = {"If-None-Match": response.headers["etag"]}, 304


async def _load(
    base: str, path: str, clients: int, seconds: float, revalidate: bool, rate: float | None = None
) -> dict:
    results: dict = {"latencies_s": [], "errors": 0}
    async with contextlib.AsyncExitStack() as stack:
        # Every client is made and connected before the clock starts: making one (its TLS context) and
        # opening its connection are not what is measured.
        limits = httpx.Limits(max_connections=1)
        made = [
            await stack.enter_async_context(httpx.AsyncClient(base_url=base, limits=limits, timeout=10))
            for _ in range(clients)
        ]
        await asyncio.gather(*(client.get("/api/health") for client in made))
        started = time.perf_counter()
        until = started + seconds
        phases = [i / clients for i in range(clients)]
        await asyncio.gather(
            *(
                _client(c, path, until, revalidate, results, rate, phase)
                for c, phase in zip(made, phases, strict=True)
            )
        )
        elapsed = time.perf_counter() - started
    return results | {"elapsed_s": elapsed}


def _percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


def summary(
    results: dict, *, clients: int, seconds: float, revalidate: bool, rate: float | None = None
) -> dict:
    latencies = sorted(results["latencies_s"])
    ms = lambda seconds: round(seconds * 1e3, 2)  # noqa: E731
    return {
        "clients": clients,
        "seconds": seconds,
        "revalidate": revalidate,
        "rate_per_client": rate,
        "requests": len(latencies),
        "errors": results["errors"],
        "requests_per_s": round(len(latencies) / results["elapsed_s"], 1),
        "p50_ms": ms(statistics.median(latencies)) if latencies else None,
        "p99_ms": ms(_percentile(latencies, 0.99)) if latencies else None,
        "max_ms": ms(latencies[-1]) if latencies else None,
        "cpu_count": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50, help="concurrent clients (default 50)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long they ask (default 60)")
    parser.add_argument("--revalidate", action="store_true", help="send If-None-Match after the first 200")
    parser.add_argument(
        "--rate", type=float, default=None, help="requests/s of each client, paced (default: back to back)"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    args = parser.parse_args(argv)
    if args.clients < 1 or args.seconds <= 0 or (args.rate is not None and args.rate <= 0):
        parser.error("--clients must be at least 1, --seconds and --rate more than 0")
    with tempfile.TemporaryDirectory(prefix="moetune-load-") as folder:
        url = f"sqlite:///{Path(folder) / 'moetune.db'}"
        device_kind, backend = seed(url)
        path = f"/api/packs/{urllib.parse.quote(device_kind)}/{backend}"
        with server(url) as base:
            results = asyncio.run(_load(base, path, args.clients, args.seconds, args.revalidate, args.rate))
    options = dict(clients=args.clients, seconds=args.seconds, revalidate=args.revalidate, rate=args.rate)
    result = summary(results, **options)
    if args.json:
        print(json.dumps(result))
    else:
        revalidating = " (revalidating)" if args.revalidate else ""
        revalidating += f" at {args.rate:g}/s each" if args.rate else ""
        print(
            f"{result['clients']} clients, {result['seconds']:g} s{revalidating}: "
            f"{result['requests']} requests, {result['requests_per_s']} /s, {result['errors']} errors; "
            f"p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, max {result['max_ms']} ms"
        )
    return result


if __name__ == "__main__":
    main()
