"""lab/bench/serve_load.py works end to end for a few seconds: a seeded server started on loopback,
concurrent clients, a summary with latencies and no errors (no latency is asserted: it is the machine's),
and a run file the baselines take; its record of the machine and of the CPU time others took."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest

from moetune_lab.baselines import service
from moetune_lab.bench import serve_load


@pytest.mark.slow  # a server process starts (its imports take most of the time)
def test_a_short_load_run_reports_its_numbers_and_writes_a_run_file_for_the_baselines(capsys, tmp_path):
    out = tmp_path / "load.json"
    argv = ["--clients", "4", "--seconds", "1.5", "--revalidate", "--json", "--out", str(out)]
    result = serve_load.main(argv)
    assert json.loads(capsys.readouterr().out) == result
    assert result["clients"] == 4 and result["revalidate"] is True
    assert result["requests"] > 4 and result["errors"] == 0
    assert 0 < result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]
    assert result["requests_per_s"] > 0
    assert result["goal_p99_ms"] == serve_load.GOAL_P99_MS["packs"]
    assert 0 <= result["others_cpu_share"] <= 1 and result["warmup_s"] >= 0
    run = json.loads(out.read_text())
    assert run["results"] == [result]
    assert run["environment"]["command"] == "python3 lab/bench/serve_load.py " + " ".join(argv)
    (made,) = service.load_entries(run)
    assert made["name"] == "serve_load/clients=4,workers=1,revalidate/packs"
    assert made["command"].endswith("--out $OUT/load.json")
    assert service.problems_of(service.add(tmp_path / "service_loopback.json", [made])) == []


def test_the_environment_names_the_machine_the_versions_and_the_command():
    env = serve_load.environment(["--each", "--workers", "2"])
    assert env["command"] == "python3 lab/bench/serve_load.py --each --workers 2"
    assert env["machine"]["cores"] == len(os.sched_getaffinity(0)) and env["machine"]["cpu"]
    assert env["machine"]["os"].endswith(os.uname().release)
    assert {"python", "moetune", "fastapi", "uvicorn", "sqlalchemy"} <= set(env["versions"])
    assert len(env["load_average"]) == 3 and env["date"].endswith("Z")


def test_others_share_is_the_machines_busy_time_less_ours_over_its_cores():
    assert serve_load.others_share(busy_s=5.0, own_s=3.0, elapsed_s=2.0, cores=2) == 0.5
    assert serve_load.others_share(busy_s=3.0, own_s=3.1, elapsed_s=2.0, cores=2) == 0.0  # ticks apart
    assert serve_load.others_share(busy_s=9.0, own_s=0.0, elapsed_s=2.0, cores=2) == 1.0
    assert serve_load.others_share(busy_s=1.0, own_s=0.0, elapsed_s=0.0, cores=2) == 0.0


def test_waiting_for_quiet_ends_at_the_first_quiet_window_or_at_its_limit(monkeypatch):
    # The machine's busy CPU seconds at each reading: a window wholly busy with others, then a quiet one.
    readings = iter([0.0, 100.0, 100.0, 100.0])
    monkeypatch.setattr(serve_load, "_busy_cpu_s", lambda: next(readings))
    monkeypatch.setattr(serve_load, "_own_cpu_s", lambda pid: 0.0)
    assert serve_load.wait_for_quiet(1, 2, 0.1, window_s=0.01) == 0.0
    assert next(readings, "all read") == "all read"
    busy = iter(range(0, 10_000, 100))  # always busy: the limit ends the wait after one window
    monkeypatch.setattr(serve_load, "_busy_cpu_s", lambda: float(next(busy)))
    assert serve_load.wait_for_quiet(1, 2, 0.1, window_s=0.01, limit_s=0) == 1.0
    monkeypatch.setattr(serve_load, "_busy_cpu_s", lambda: None)  # no /proc: no wait
    assert serve_load.wait_for_quiet(1, 2, 0.1, window_s=0.01) is None


def test_max_others_must_be_a_share():
    with pytest.raises(SystemExit):
        serve_load.main(["--max-others", "1.5"])


BURN = """
import os, sys, time
if os.fork() == 0:  # the server's second process (serve --workers forks it) burns 0.3 s of CPU
    while time.process_time() < 0.3:
        pass
    print("burnt", flush=True)
    time.sleep(60)
    os._exit(0)
time.sleep(60)
"""


def test_our_cpu_time_counts_the_server_and_the_processes_it_forked():
    server = subprocess.Popen([sys.executable, "-c", BURN], stdout=subprocess.PIPE, text=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        before = sum(os.times()[:2])
        assert server.stdout.readline() == "burnt\n"
        time.sleep(0.05)  # /proc's counters lag a tick
        assert serve_load._own_cpu_s(server.pid) - before >= 0.25
        assert serve_load._own_cpu_s(other.pid) - before < 0.25  # another server: the burn is not ours
        assert serve_load._busy_cpu_s() > 0
    finally:
        for process in (server, other):
            process.kill()
            process.wait()


def test_a_run_with_an_error_fails_the_command():
    clean = {"target": "packs", "errors": 0, "requests": 10}
    assert serve_load.failures(clean) == []
    assert serve_load.failures([clean, clean | {"target": "jobs", "errors": 3}]) == [
        "jobs: 3 of 10 requests failed"
    ]
    causes = {"/api/jobs: HTTP 503": 2, "/api/jobs: no answer within 10 s": 1}
    assert serve_load.failures(clean | {"target": "jobs", "errors": 3, "error_causes": causes}) == [
        "jobs: 3 of 10 requests failed\n    2 x /api/jobs: HTTP 503\n    1 x /api/jobs: no answer within 10 s"
    ]


def test_the_servers_log_is_quoted_from_its_first_error(tmp_path):
    log = tmp_path / "server.log"
    assert serve_load.server_errors(log) == []  # no log at all
    log.write_text("INFO:     Started server process [1]\nINFO:     Application startup complete.\n")
    assert serve_load.server_errors(log) == []
    log.write_text(
        "INFO:     Started server process [1]\nERROR:    Exception in ASGI application\n"
        "Traceback (most recent call last):\n  File x\nValueError: boom\n"
    )
    assert serve_load.server_errors(log, limit=3) == [
        "ERROR:    Exception in ASGI application",
        "Traceback (most recent call last):",
        "  File x",
    ]


def _ask(base: str, paths: list[str], seconds: float) -> dict:
    """One client asking `paths` in turn for `seconds`: its results (errors and their causes)."""

    async def ask() -> dict:
        results: dict = {"latencies_s": [], "errors": 0, "why": {}, "by_path": {}}
        client = serve_load._Connection(base)
        try:
            await serve_load._client(client, paths, time.perf_counter() + seconds, False, results, None)
        finally:
            await client.close()
        return results

    return serve_load._run(ask())


@pytest.mark.slow  # a server process starts
def test_each_failed_request_is_counted_with_its_cause(tmp_path):
    """A route that answers 404, and a server that is gone: each error names its path and what happened."""
    url = f"sqlite:///{tmp_path / 'moetune.db'}"
    serve_load.seed(url)
    with serve_load.server(url) as (base, _pid):
        results = _ask(base, ["/api/health", "/api/sweeps/999/trials"], 0.5)
    requests = len(results["latencies_s"])
    assert results["errors"] == requests // 2 and results["why"] == {
        "/api/sweeps/999/trials: HTTP 404": requests // 2
    }
    gone = _ask(base, ["/api/health"], 0.2)
    (cause,) = gone["why"]
    assert gone["errors"] == len(gone["latencies_s"]) > 0
    assert cause.startswith("/api/health: the exchange failed (ConnectionRefusedError")


@pytest.mark.slow  # a server process starts, and a client waits out its keep-alive
def test_a_client_idle_past_the_servers_keep_alive_reconnects_instead_of_failing(tmp_path):
    """uvicorn closes a connection idle for 5 s; a client that waited longer (its warm-up ended before the
    others', or it is paced slowly) opens a new one, as HTTP clients do, rather than count an error."""
    url = f"sqlite:///{tmp_path / 'moetune.db'}"
    serve_load.seed(url)

    async def ask_twice(base: str) -> list[int]:
        client = serve_load._Connection(base)
        try:
            first, _ = await client.get("/api/health", {})
            await asyncio.sleep(6.0)  # past uvicorn's 5 s
            second, _ = await client.get("/api/health", {})
        finally:
            await client.close()
        return [first, second]

    with serve_load.server(url) as (base, _pid):
        assert serve_load._run(ask_twice(base)) == [200, 200]


@pytest.mark.slow
def test_paced_clients_send_about_their_rate(capsys):
    result = serve_load.main(["--clients", "2", "--seconds", "2", "--rate", "5", "--json"])
    assert result["rate_per_client"] == 5 and result["errors"] == 0
    # 2 clients x 5/s x 2 s, give or take the last request of each: paced, not back to back.
    assert 16 <= result["requests"] <= 24


@pytest.mark.slow
def test_a_mix_of_listings_and_pages_on_two_server_processes(capsys):
    """What CI runs of the service's load: every target once in a mix, on `serve --workers 2`."""
    args = ["--clients", "4", "--seconds", "2", "--workers", "2", "--revalidate", "--json"]
    for target in serve_load.TARGETS:
        args += ["--target", target]
    result = serve_load.main(args)
    assert result["errors"] == 0 and result["workers"] == 2
    assert set(result["by_path"]) == {
        path.format(pack="/api/packs/NVIDIA%20H200/mosaic_gpu", sweep="1")
        for path in serve_load.TARGETS.values()
    }
