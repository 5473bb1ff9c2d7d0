"""lab/bench/serve_load.py works end to end for a few seconds: a seeded server started on loopback,
concurrent clients, a summary with latencies and no errors (no latency is asserted: it is the machine's)."""

from __future__ import annotations

import json

import pytest

from moetune_lab.bench import serve_load


@pytest.mark.slow  # a server process starts (its imports take most of the time)
def test_a_short_load_run_reports_its_numbers(capsys):
    result = serve_load.main(["--clients", "4", "--seconds", "1.5", "--revalidate", "--json"])
    assert json.loads(capsys.readouterr().out) == result
    assert result["clients"] == 4 and result["revalidate"] is True
    assert result["requests"] > 4 and result["errors"] == 0
    assert 0 < result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]
    assert result["requests_per_s"] > 0


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
