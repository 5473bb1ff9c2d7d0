"""Load on the service: N concurrent clients for S seconds against a `moetune serve` it starts on
loopback, over a database seeded with the shipped H200 pack (and a sweep of trials, misses and jobs);
prints p50/p99/max latency, requests/s and errors.

    python3 lab/bench/serve_load.py                     # the pack, 50 clients, 60 s, fresh fetches (200s)
    python3 lab/bench/serve_load.py --revalidate --json # clients send If-None-Match (304s)
    python3 lab/bench/serve_load.py --rate 10           # each client paced at 10 requests/s
    python3 lab/bench/serve_load.py --target winners    # another route (TARGETS); repeat for a mix
    python3 lab/bench/serve_load.py --each --seconds 25 # each target in turn, then all of them mixed
    python3 lab/bench/serve_load.py --workers 2         # the server as 2 processes (serve --workers)
    python3 lab/bench/serve_load.py --max-others 0.1    # on a shared machine: runs when it is quiet
    python3 lab/bench/serve_load.py --each --out load.json  # and a run file for the baselines:
    python3 -m moetune_lab.baselines add-serve-load load.json   # -> lab/baselines/service_loopback.json

With several targets (a mix) each client asks them in turn, and the summary has each one's latencies.
The run file (--out) holds each run's summary, the p99 goal of its route (GOAL_P99_MS) and the
environment: date, command, the machine (CPU model, cores, OS), the server's and the client's package
versions, the load average before the run and, per run, how much of the machine's CPU time went to
processes other than the clients and the server (others running meanwhile skew the figures; with
--max-others each run waits for a quiet moment and is made again when others took more than that).

Each client is one connection that asks again as soon as it has its answer (a closed loop), so
requests/s is what the server sustains and latency includes queueing behind the other clients; with
--rate each is paced instead, and latency counts from when a request was due. Before the clock
starts, each client has had one answer of each of its routes: a route's first draw in a server process
(seconds for a big sweep's page) is reported apart, as warmup_s, and not in the latencies. Client
and server share this machine's cores: on a small machine the numbers say as much about the client as
about the server. An error is any answer but 200 (304 with --revalidate) and any failed request; the
command exits 1 when a run had one (after printing its figures and writing --out), so CI can run it
without asserting on any latency.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib.metadata
import importlib.resources
import json
import os
import platform
import secrets
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

SHIPPED_PACK = "nvidia_h200__mosaic_gpu.json"
START_TIMEOUT_S = 60  # for the server to start, and for each route's first answer (a warm-up)
REQUEST_TIMEOUT_S = 10  # a measured request that takes longer is an error
# A server closes a keep-alive connection left idle (uvicorn: after 5 s), and a request sent as it does
# fails. A client idle for longer than this opens a new connection first, as HTTP clients do: a client
# whose warm-up ended before the others' did, or one paced slower than one request per 4 s.
IDLE_REOPEN_S = 4.0
# --max-others: how long a quiet moment is, how long to wait for one, and how often a run is made again.
QUIET_WINDOW_S = 2.0
QUIET_WAIT_S = 600.0
QUIET_ATTEMPTS = 5
SEEDED_TRIALS = 300  # one sweep's, beside the pack's winners
SEEDED_MISSES = 40
SEEDED_JOBS = 20
# A target's name -> its path ({pack}: the seeded pack's; {sweep}: the seeded sweep's id).
TARGETS = {
    "packs": "{pack}",
    "health": "/api/health",
    "winners": "/api/winners",
    "stale": "/api/winners/stale",
    "sweeps": "/api/sweeps",
    "trials": "/api/sweeps/{sweep}/trials",
    "misses": "/api/misses",
    "jobs": "/api/jobs",
    "page-sweeps": "/",
    "page-winners": "/winners",
    "page-misses": "/misses",
    "page-sweep": "/sweeps/{sweep}",
}
# The service's goals at 50 clients on loopback, p99 in ms (and no error): packs within 25 ms, every paged
# listing and page within 50 ms. Health has none: it is how the clients connect, not a route users read.
LISTINGS = ("winners", "stale", "sweeps", "trials", "misses", "jobs")
PAGES = ("page-sweeps", "page-winners", "page-misses", "page-sweep")
GOAL_P99_MS = {"packs": 25.0} | {name: 50.0 for name in LISTINGS + PAGES}
# The packages whose versions decide the figures: the server's, and the client's loop.
VERSIONS = ("moetune", "fastapi", "starlette", "uvicorn", "httptools", "sqlalchemy", "pydantic", "uvloop")


def seed(url: str) -> tuple[str, str, int]:
    """The shipped pack's winners, promoted in the database at `url`, and a sweep of SEEDED_TRIALS trials
    over its problems, SEEDED_MISSES misses and SEEDED_JOBS queued jobs: (device_kind, backend, the
    sweep's id). Written as trials and promoted rather than through `moetune import`, whose check of every
    config against its backend's search space would take longer than a short run."""
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
        sweep_id = store.create_sweep(
            backend=pack.backend, strategy="grid", spec={}, host="load", user="load", device=pack.device
        )
        for i in range(SEEDED_TRIALS):
            entry = pack.entries[i % len(pack.entries)]
            median = (entry.median_s or 1e-3) * (1 + i / SEEDED_TRIALS)
            trial = TrialRecord(
                sweep_id=sweep_id,
                device=pack.device,
                backend=pack.backend,
                family="",
                source_hash=pack.kernel_source_hash,
                problem=entry.problem,
                config=entry.config,
                status="ok" if i % 10 else "compile_error",
                samples_s=(median,) if i % 10 else (),
                median_s=median if i % 10 else None,
                error="" if i % 10 else "load: a seeded failure",
            )
            store.record_trial(trial)
        store.finish_sweep(sweep_id, "done")
        for i in range(SEEDED_MISSES):
            problem = pack.entries[i % len(pack.entries)].problem
            store.record_miss(
                device=pack.device, backend=pack.backend, problem=problem.with_m(problem.m + 8 * i)
            )
        for i in range(SEEDED_JOBS):
            store.submit_job({"problems": [f"m={16 * (i + 1)},k=64,n=256,g=4,dtype=bf16"], "backend": "xla"})
    return pack.device.device_kind, pack.backend, sweep_id


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def server(url: str, workers: int = 1, log: Path | None = None) -> Iterator[tuple[str, int]]:
    """`moetune serve` on a free loopback port, in a process of its own (`workers` processes): its base
    URL and the first process's pid (the others are its children). Its log goes to `log` (or nowhere): a
    pipe nobody reads while clients run would stall the server once it filled."""
    port = _free_port()
    env = os.environ | {"MOETUNE_SERVER_TOKEN": secrets.token_urlsafe(24)}
    command = [sys.executable, "-m", "moetune.cli", "serve", "--db", url, "--port", str(port)]
    command += ["--workers", str(workers)] if workers > 1 else []
    with open(log or os.devnull, "w") as sink:
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=sink)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                httpx.get(base + "/api/health", timeout=1).raise_for_status()
                break
            except httpx.TransportError:
                if process.poll() is not None or time.monotonic() > deadline:
                    said = log.read_text()[-2000:] if log else ""
                    raise SystemExit(f"the server did not start: {said}") from None
                time.sleep(0.1)
        yield base, process.pid
    finally:
        process.terminate()
        process.wait(timeout=30)


def server_errors(log: Path, limit: int = 40) -> list[str]:
    """The server's log from its first error or traceback on (`limit` lines at most): why requests failed,
    beside the clients' count of them."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    first = next((i for i, line in enumerate(lines) if "ERROR" in line or line.startswith("Traceback")), None)
    return [] if first is None else lines[first : first + limit]


def machine() -> dict:
    """What ran the server and the clients: the CPU model, the cores this process may use, the OS."""
    cpu = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
    system = f"{platform.system()} {platform.release()}"
    with contextlib.suppress(OSError):
        lines = Path("/etc/os-release").read_text().splitlines()
        release = dict(line.split("=", 1) for line in lines if "=" in line)
        if "PRETTY_NAME" in release:
            system = release["PRETTY_NAME"].strip('"') + ", " + system
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu or platform.processor() or platform.machine(), "cores": cores, "os": system}


def versions() -> dict[str, str]:
    """Python's version and each of VERSIONS that is installed."""
    found = {"python": platform.python_version()}
    for name in VERSIONS:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    return found


def environment(argv: list[str]) -> dict:
    """The run file's environment: when, the command as typed from the repository root, the machine,
    the versions, and the load average (1, 5, 15 minutes) before the server started."""
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": shlex.join(["python3", "lab/bench/serve_load.py", *argv]),
        "machine": machine(),
        "versions": versions(),
        "load_average": [round(value, 2) for value in os.getloadavg()],
    }


def _busy_cpu_s() -> float | None:
    """The machine's CPU time so far, all processes, in seconds (Linux: /proc/stat); None elsewhere."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal: busy is all but idle and iowait.
    user, nice, system, _, _, irq, softirq, steal = (int(f) for f in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _process_cpu_s(pid: int) -> tuple[float, int] | None:
    """(CPU seconds, parent pid) of a live process (Linux: /proc/PID/stat); None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command's name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[1])


def _own_cpu_s(server_pid: int) -> float:
    """The CPU time of this process (the clients) and of the server: its first process and its children
    (serve --workers forks them)."""
    total = sum(os.times()[:2])
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            found = _process_cpu_s(int(entry.name))
            if found and (int(entry.name) == server_pid or found[1] == server_pid):
                total += found[0]
    return total


@contextlib.contextmanager
def cpu_of_others(server_pid: int, cores: int) -> Iterator[dict]:
    """Yields a dict that gets, at the end of the block, `others_cpu_share`: the share of the machine's
    cores that processes other than the clients and the server used meanwhile (0.0 on a quiet machine;
    0.5 on two cores: one core's worth went elsewhere), or None where /proc cannot tell."""
    out: dict = {}
    busy, own, started = _busy_cpu_s(), _own_cpu_s(server_pid), time.perf_counter()
    yield out
    busy_after, own_after = _busy_cpu_s(), _own_cpu_s(server_pid)
    elapsed = time.perf_counter() - started
    if busy is None or busy_after is None:
        out["others_cpu_share"] = None
        return
    out["others_cpu_share"] = others_share(busy_after - busy, own_after - own, elapsed, cores)


def wait_for_quiet(
    server_pid: int,
    cores: int,
    max_share: float,
    *,
    window_s: float = QUIET_WINDOW_S,
    limit_s: float = QUIET_WAIT_S,
) -> float | None:
    """Waits until processes other than the clients and the server took at most `max_share` of the CPU
    over a window of `window_s` (`limit_s` at most in all): the last window's share, None where /proc
    cannot tell (no wait then)."""
    deadline = time.monotonic() + limit_s
    while True:
        with cpu_of_others(server_pid, cores) as others:
            time.sleep(window_s)
        share = others["others_cpu_share"]
        if share is None or share <= max_share or time.monotonic() >= deadline:
            return share


def others_share(busy_s: float, own_s: float, elapsed_s: float, cores: int) -> float:
    """The share of `cores` over `elapsed_s` that went to CPU time other than our own: what the machine
    was busy with (`busy_s`) less the clients' and the server's (`own_s`), within 0 and 1 (the two
    counters tick apart, so a quiet machine can come out a little below 0)."""
    if elapsed_s <= 0 or cores < 1:
        return 0.0
    return round(min(1.0, max(0.0, busy_s - own_s) / (elapsed_s * cores)), 3)


class _Connection:
    """One keep-alive HTTP/1.1 connection that GETs a path and reads the whole answer: the least a
    client can do per request. On a small machine the clients share the cores with the server, and a
    full HTTP client library (httpx) costs more CPU per request than the server's answer does, so it
    would measure itself."""

    def __init__(self, base: str) -> None:
        parsed = urllib.parse.urlsplit(base)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._used_at = 0.0  # when the last answer came (time.monotonic)

    async def open(self) -> None:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
            self._reader = self._writer = None

    async def get(
        self, path: str, headers: dict[str, str], timeout_s: float = REQUEST_TIMEOUT_S
    ) -> tuple[int, str | None]:
        """(status, ETag); OSError when the exchange fails or takes over `timeout_s` (the next call
        reconnects)."""
        try:
            return await asyncio.wait_for(self._get(path, headers), timeout_s)
        except TimeoutError:
            await self.close()
            raise OSError(f"no answer within {timeout_s:g} s") from None
        except (OSError, asyncio.IncompleteReadError, ValueError) as error:
            await self.close()
            raise OSError(f"the exchange failed ({type(error).__name__}: {error})") from None

    async def _get(self, path: str, headers: dict[str, str]) -> tuple[int, str | None]:
        if self._writer is not None and time.monotonic() - self._used_at > IDLE_REOPEN_S:
            await self.close()
        if self._writer is None:
            await self.open()
        assert self._reader is not None and self._writer is not None
        lines = [f"GET {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        self._writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        head = (await self._reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split(" ", 2)[1])
        fields = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:] if h)}
        length = int(fields.get("content-length", "0"))
        if length:
            await self._reader.readexactly(length)
        self._used_at = time.monotonic()
        if fields.get("connection", "").lower() == "close":
            await self.close()
        return status, fields.get("etag")


async def _client(
    client: _Connection,
    paths: list[str],
    until: float,
    revalidate: bool,
    results: dict,
    rate: float | None,
    phase: float = 0.0,
) -> None:
    tags: dict[str, str] = {}  # path -> the ETag its last 200 carried (revalidate)
    turn = int(phase * len(paths))  # clients start at different targets of a mix
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
        path = paths[turn % len(paths)]
        turn += 1
        headers = {"If-None-Match": tags[path]} if path in tags else {}
        etag = None
        try:
            status, etag = await client.get(path, headers)
        except OSError as error:
            status, why = None, str(error)
        latency = time.perf_counter() - started
        results["latencies_s"].append(latency)
        results["by_path"].setdefault(path, []).append(latency)
        if status != (304 if path in tags else 200):
            results["errors"] += 1
            what = f"{path}: {why if status is None else f'HTTP {status}'}"
            results["why"][what] = results["why"].get(what, 0) + 1
        elif revalidate and status == 200 and etag:
            tags[path] = etag


async def _load(
    base: str, paths: list[str], clients: int, seconds: float, revalidate: bool, rate: float | None = None
) -> dict:
    results: dict = {"latencies_s": [], "errors": 0, "why": {}, "by_path": {}}
    made = [_Connection(base) for _ in range(clients)]
    try:
        # Every client is connected, and has had one answer of each of its routes, before the clock
        # starts: opening a connection and a route's first draw in each server process are not what is
        # measured (a big sweep's page takes seconds to draw the first time; its re-draws under load are
        # measured). How long those first answers took is kept apart: warmup_s.
        warming = time.perf_counter()
        failed = [line for line in await asyncio.gather(*(_warm(c, paths) for c in made)) if line]
        if failed:
            raise SystemExit(f"a route did not answer before the clock started: {failed[0]}")
        warmup_s = time.perf_counter() - warming
        started = time.perf_counter()
        until = started + seconds
        phases = [i / clients for i in range(clients)]
        await asyncio.gather(
            *(
                _client(c, paths, until, revalidate, results, rate, phase)
                for c, phase in zip(made, phases, strict=True)
            )
        )
        elapsed = time.perf_counter() - started
    finally:
        await asyncio.gather(*(client.close() for client in made))
    return results | {"elapsed_s": elapsed, "warmup_s": warmup_s}


async def _warm(client: _Connection, paths: list[str]) -> str | None:
    """One untimed answer of each path on `client`'s connection (START_TIMEOUT_S each); what failed, or
    None."""
    for path in paths:
        try:
            status, _ = await client.get(path, {}, timeout_s=START_TIMEOUT_S)
        except OSError as error:
            return f"{path}: {error}"
        if status != 200:
            return f"{path}: {status}"
    return None


def _run(coroutine: Any) -> Any:
    """asyncio.run, on uvloop where it is installed (the clients' own overhead is smaller there)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return asyncio.run(coroutine, loop_factory=uvloop.new_event_loop)


def _percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


def summary(
    results: dict, *, clients: int, seconds: float, revalidate: bool, rate: float | None = None
) -> dict:
    latencies = sorted(results["latencies_s"])
    ms = lambda seconds: round(seconds * 1e3, 2)  # noqa: E731
    by_path = {}
    if len(results.get("by_path", {})) > 1:
        for path, values in results["by_path"].items():
            values = sorted(values)
            by_path[path] = {"requests": len(values), "p50_ms": ms(statistics.median(values))}
            by_path[path] |= {"p99_ms": ms(_percentile(values, 0.99)), "max_ms": ms(values[-1])}
    return {
        "clients": clients,
        "seconds": seconds,
        "revalidate": revalidate,
        "rate_per_client": rate,
        "requests": len(latencies),
        "errors": results["errors"],
        "error_causes": dict(sorted(results.get("why", {}).items(), key=lambda item: -item[1])),
        "requests_per_s": round(len(latencies) / results["elapsed_s"], 1),
        "p50_ms": ms(statistics.median(latencies)) if latencies else None,
        "p99_ms": ms(_percentile(latencies, 0.99)) if latencies else None,
        "max_ms": ms(latencies[-1]) if latencies else None,
        "cpu_count": os.cpu_count(),
        "warmup_s": round(results["warmup_s"], 2),
    } | ({"by_path": by_path} if by_path else {})


def main(argv: list[str] | None = None) -> dict | list[dict]:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50, help="concurrent clients (default 50)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long they ask (default 60)")
    parser.add_argument("--revalidate", action="store_true", help="send If-None-Match after the first 200")
    parser.add_argument(
        "--rate", type=float, default=None, help="requests/s of each client, paced (default: back to back)"
    )
    parser.add_argument(
        "--target",
        action="append",
        choices=sorted(TARGETS),
        help="what the clients ask (default: packs); repeated: a mix, each client asking them in turn",
    )
    parser.add_argument("--each", action="store_true", help="every target in turn, then all mixed")
    parser.add_argument("--workers", type=int, default=1, help="server processes (serve --workers)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.add_argument(
        "--max-others",
        type=float,
        metavar="SHARE",
        help="on a shared machine: start each run when other processes take at most SHARE of the CPU "
        f"(0 to 1), and make a run again, up to {QUIET_ATTEMPTS} times, when they took more during it",
    )
    parser.add_argument(
        "--out", type=Path, help="write the run file (environment and every run's summary) for the baselines"
    )
    args = parser.parse_args(argv)
    if (
        args.clients < 1
        or args.seconds <= 0
        or (args.rate is not None and args.rate <= 0)
        or args.workers < 1
        or (args.max_others is not None and not 0 <= args.max_others <= 1)
    ):
        parser.error(
            "--clients and --workers must be at least 1, --seconds and --rate more than 0, "
            "--max-others within 0 and 1"
        )
    if args.each:
        runs = [[name] for name in TARGETS] + [list(TARGETS)]
    else:
        runs = [args.target or ["packs"]]
    env = environment(argv)  # the load average before anything of this run starts
    results = []
    with tempfile.TemporaryDirectory(prefix="moetune-load-") as folder:
        url = f"sqlite:///{Path(folder) / 'moetune.db'}"
        device_kind, backend, sweep_id = seed(url)
        fill = {"pack": f"/api/packs/{urllib.parse.quote(device_kind)}/{backend}", "sweep": str(sweep_id)}
        log = Path(folder) / "server.log"
        with server(url, args.workers, log) as (base, pid):
            for targets in runs:
                for attempt in range(1, QUIET_ATTEMPTS + 1):
                    if args.max_others is not None:
                        wait_for_quiet(pid, env["machine"]["cores"], args.max_others)
                    result = _one_run(args, base, pid, env["machine"]["cores"], targets, fill)
                    share = result["others_cpu_share"]
                    if args.max_others is None or share is None or share <= args.max_others:
                        break
                    if attempt < QUIET_ATTEMPTS:
                        again = f"{result['target']}: others took {share:.0%} of the CPU: again"
                        print(again, file=sys.stderr)
                results.append(result)
                if not args.json:
                    _print(result)
        if any(result["errors"] for result in results):
            said = server_errors(log)
            print(
                "the server's log, from its first error:" if said else "the server logged no error",
                file=sys.stderr,
            )
            for line in said:
                print(f"    {line}", file=sys.stderr)
    if args.out:
        args.out.write_text(json.dumps({"environment": env, "results": results}, indent=1) + "\n")
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results))
    return results[0] if len(results) == 1 else results


def _one_run(
    args: argparse.Namespace, base: str, pid: int, cores: int, targets: list[str], fill: dict
) -> dict:
    """One measured run of `targets` against the server at `base`: its summary."""
    paths = [TARGETS[name].format(**fill) for name in targets]
    load = _load(base, paths, args.clients, args.seconds, args.revalidate, args.rate)
    with cpu_of_others(pid, cores) as others:
        measured = _run(load)
    options = dict(clients=args.clients, seconds=args.seconds, revalidate=args.revalidate, rate=args.rate)
    result = summary(measured, **options)
    result |= {"target": "+".join(targets) if len(targets) < len(TARGETS) else "mixed"}
    result |= {"workers": args.workers, "paths": dict(zip(targets, paths, strict=True))}
    if len(targets) == 1 and targets[0] in GOAL_P99_MS:
        result["goal_p99_ms"] = GOAL_P99_MS[targets[0]]
    return result | others


def failures(results: dict | list[dict]) -> list[str]:
    """One line per run that had an error: what makes the command exit 1."""
    runs = results if isinstance(results, list) else [results]
    return [
        f"{r['target']}: {r['errors']} of {r['requests']} requests failed"
        + "".join(f"\n    {count} x {cause}" for cause, count in r.get("error_causes", {}).items())
        for r in runs
        if r["errors"]
    ]


def _goal_and_others(result: dict) -> str:
    """'; goal p99 <= 25 ms: met; others used 3% of the CPU' (each part where the run has it)."""
    text = ""
    goal, p99 = result.get("goal_p99_ms"), result["p99_ms"]
    if goal is not None and p99 is not None:
        text += f"; goal p99 <= {goal:g} ms: {'met' if p99 <= goal else 'missed'}"
    if result.get("others_cpu_share") is not None:
        text += f"; others used {result['others_cpu_share']:.0%} of the CPU"
    return text


def _print(result: dict) -> None:
    revalidating = " (revalidating)" if result["revalidate"] else ""
    revalidating += f" at {result['rate_per_client']:g}/s each" if result["rate_per_client"] else ""
    print(
        f"{result['target']}: {result['clients']} clients, {result['seconds']:g} s{revalidating}: "
        f"{result['requests']} requests, {result['requests_per_s']} /s, {result['errors']} errors; "
        f"p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, max {result['max_ms']} ms"
        + _goal_and_others(result)
    )
    for path, figures in result.get("by_path", {}).items():
        p50, p99 = figures["p50_ms"], figures["p99_ms"]
        print(f"    {path}: {figures['requests']} requests, p50 {p50} ms, p99 {p99} ms")


if __name__ == "__main__":
    failed = failures(main())
    for line in failed:
        print(f"error: {line}", file=sys.stderr)
    sys.exit(1 if failed else 0)
