"""lab/baselines/service.py: the service's load on loopback as baselines of its own (a CPU machine, not a
GPU), built from serve_load.py --out files, rendered as a table and quoted in prose; on synthetic runs,
and the committed file's validity."""

from __future__ import annotations

import copy
import json

import pytest
from tests.bench.test_baselines import data, entry
from tests.bench.test_quotes import quoted

from moetune_lab.baselines import cli as baselines
from moetune_lab.baselines import quotes, service, tables

PACK = "/api/packs/NVIDIA%20H200/mosaic_gpu"


def result(target="packs", workers=1, p99=9.5, errors=0, **more) -> dict:
    """One run's summary as serve_load.py writes it."""
    made = {
        "clients": 50,
        "seconds": 25.0,
        "revalidate": False,
        "rate_per_client": None,
        "requests": 1000,
        "errors": errors,
        "requests_per_s": 40.0,
        "p50_ms": 4.5,
        "p99_ms": p99,
        "max_ms": 100.0,
        "cpu_count": 2,
        "warmup_s": 0.25,
        "target": target,
        "workers": workers,
        "paths": {"packs": PACK} if target == "packs" else {target: f"/api/{target}"},
        "others_cpu_share": 0.02,
    }
    if target == "packs":
        made["goal_p99_ms"] = 25.0
    return made | more


def mixed(workers=1) -> dict:
    by_path = {
        PACK: {"requests": 500, "p50_ms": 4.0, "p99_ms": 30.0, "max_ms": 40.0},
        "/api/winners": {"requests": 500, "p50_ms": 5.0, "p99_ms": 12.0, "max_ms": 60.0},
    }
    return result("mixed", workers, p99=28.0) | {
        "paths": {"packs": PACK, "winners": "/api/winners"},
        "by_path": by_path,
    }


def run(*results) -> dict:
    """A serve_load.py --out file."""
    return {
        "environment": {
            "date": "2026-12-04T23:10:00Z",
            "command": "python3 lab/bench/serve_load.py --each --workers 1 --out /data/run/load.json",
            "machine": {"cpu": "Test CPU", "cores": 2, "os": "Test OS"},
            "versions": {
                "python": "3.12.1",
                "moetune": "0.1.0",
                "fastapi": "0.1",
                "uvicorn": "0.2",
                "sqlalchemy": "2.1",
            },
            "load_average": [0.3, 0.5, 0.9],
        },
        "results": list(results) or [result(), mixed()],
    }


def service_data(*entries) -> dict:
    return {"schema": service.SCHEMA, "schema_version": 1, "setting": "loopback", "entries": list(entries)}


def test_the_committed_service_baselines_are_valid_and_of_the_issue_setting():
    files = [p for p in sorted(baselines.BASELINES.glob("*.json")) if service.is_service_file(p)]
    assert [p.name for p in files] == ["service_loopback.json"]
    loaded = service.load(files[0])  # raises on any schema break
    settings = {(e["params"]["clients"], e["params"]["seconds"]) for e in loaded["entries"]}
    assert (50, 25.0) in settings
    assert baselines.load_all()["service_loopback"] == loaded


def test_a_run_file_becomes_one_entry_per_run_named_by_its_setting_and_route():
    made = service.load_entries(run())
    assert [e["name"] for e in made] == [
        "serve_load/clients=50,workers=1/packs",
        "serve_load/clients=50,workers=1/mixed",
    ]
    packs, mix = made
    assert packs["command"] == "python3 lab/bench/serve_load.py --each --workers 1 --out $OUT/load.json"
    assert packs["machine"] == {"cpu": "Test CPU", "cores": 2, "os": "Test OS"}
    assert packs["figures"] == {
        "requests": 1000, "errors": 0, "requests_per_s": 40.0, "p50_ms": 4.5, "p99_ms": 9.5, "max_ms": 100.0,
        "warmup_s": 0.25,
    }  # fmt: skip
    assert packs["goal"] == {"p99_ms": 25.0} and "goal" not in mix
    assert packs["params"]["paths"] == {"packs": PACK} and packs["others_cpu_share"] == 0.02
    assert mix["by_target"]["packs"]["p99_ms"] == 30.0 and mix["by_target"]["winners"]["requests"] == 500
    assert service.problems_of(service_data(*made)) == []
    revalidating = service.load_entries(run(result(revalidate=True, rate_per_client=10.0)))[0]
    assert revalidating["name"] == "serve_load/clients=50,workers=1,revalidate,rate=10/packs"
    assert revalidating["params"]["rate_per_client"] == 10.0


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda e: e.pop("machine"), "missing machine"),
        (lambda e: e.update(gpu="NVIDIA H200"), "unknown field 'gpu'"),
        (lambda e: e["machine"].update(cores=0), "a positive number of cores"),
        (lambda e: e["versions"].pop("uvicorn"), "versions must name at least python, moetune, fastapi"),
        (lambda e: e.update(date="2026-12-04"), "is not an ISO 8601 UTC time"),
        (lambda e: e.update(load_average=[0.1]), "load_average must be the 1, 5 and 15 minute"),
        (lambda e: e.update(others_cpu_share=1.5), "others_cpu_share must be a share"),
        (lambda e: e["params"].pop("workers"), "params lacks workers"),
        (lambda e: e["figures"].update(p99_ms=1.0), "p50_ms <= p99_ms <= max_ms does not hold"),
        (lambda e: e["figures"].pop("errors"), "figures lacks errors"),
        (lambda e: e["figures"].update(errors=2000), "figures.errors must be a count of its requests"),
        (lambda e: e["figures"].update(warmup_s=-1), "figures.warmup_s must be >= 0"),
        (lambda e: e["figures"].update(p90_ms=5.0), "figures has unknown 'p90_ms'"),
        (lambda e: e["by_target"]["packs"].pop("p99_ms"), "by_target.packs lacks p99_ms"),
        (lambda e: e.update(goal={"p50_ms": 5}), "goal may hold p99_ms"),
        (lambda e: e.update(suite="bench_gemm"), "suite='bench_gemm' is not one of serve_load"),
    ],
)
def test_each_schema_break_is_named(change, problem):
    broken = copy.deepcopy(service.load_entries(run())[1])
    broken["goal"] = {"p99_ms": 50.0}
    change(broken)
    problems = service.problems_of(service_data(broken))
    assert any(problem in p for p in problems), problems


def test_file_level_breaks_are_named():
    assert service.problems_of({"schema": "moetune.baselines", "schema_version": 1, "gpu": "X"}) == [
        "schema='moetune.baselines', expected 'moetune.service_baselines'",
        "unknown field 'gpu'",
        "setting=None, expected 'loopback'",
        "entries must be a list",
    ]
    twice = service.load_entries(run(result(), result()))
    assert service.problems_of(service_data(*twice)) == [
        "the name 'serve_load/clients=50,workers=1/packs' is used more than once"
    ]


def test_adding_replaces_the_entry_of_the_same_name_and_refuses_a_broken_one(tmp_path):
    path = tmp_path / "service_loopback.json"
    first = service.add(path, service.load_entries(run()))
    path.write_text(baselines.dumps(first))
    again = service.add(path, service.load_entries(run(result(p99=20.0), result(workers=2))))
    assert [e["name"] for e in again["entries"]] == [
        "serve_load/clients=50,workers=1/packs",
        "serve_load/clients=50,workers=1/mixed",
        "serve_load/clients=50,workers=2/packs",
    ]
    assert again["entries"][0]["figures"]["p99_ms"] == 20.0
    with pytest.raises(ValueError, match="p50_ms <= p99_ms <= max_ms"):
        service.add(path, service.load_entries(run(result(p99=1.0))))


def test_the_command_line_records_a_run_file_in_the_service_baselines(tmp_path, capsys):
    run_file, path = tmp_path / "load.json", tmp_path / "service_loopback.json"
    run_file.write_text(json.dumps(run()))
    assert baselines.main(["add-serve-load", str(run_file), "--file", str(path)]) == 0
    assert "2 entries added or replaced, 2 in all" in capsys.readouterr().out
    assert service.load(path)["entries"] == service.load_entries(run())
    run_file.write_text(json.dumps({"results": []}))
    assert baselines.main(["add-serve-load", str(run_file), "--file", str(path)]) == 2
    assert "lacks the field 'environment'" in capsys.readouterr().err


def test_load_all_reads_each_gpus_file_and_the_services_by_their_schemas(tmp_path):
    (tmp_path / "test_gpu.json").write_text(baselines.dumps(data(entry())))
    (tmp_path / "service_loopback.json").write_text(
        baselines.dumps(service_data(*service.load_entries(run())))
    )
    assert [p.name for p in baselines.gpu_files(tmp_path)] == ["test_gpu.json"]
    loaded = baselines.load_all(tmp_path)
    assert loaded["test_gpu"]["gpu"] == "Test GPU" and loaded["service_loopback"]["setting"] == "loopback"
    (tmp_path / "service_loopback.json").write_text(baselines.dumps(data(entry())))  # a GPU's, misnamed
    with pytest.raises(ValueError, match="expected 'moetune.service_baselines'"):
        baselines.load_all(tmp_path)


def test_the_table_gives_each_route_per_server_processes_with_its_goal_met_or_missed():
    made = service.load_entries(run(result(), result(workers=2, p99=31.25), mixed()))
    page = "<!-- baselines service_loopback full -->\nstale\n<!-- /baselines -->\n"
    rendered = tables.render_page(page, {"service_loopback": service_data(*made)})
    assert "stale" not in rendered
    assert "#### 50 clients, 25 s per run, fresh fetches (200s), back to back" in rendered
    assert "Measured 2026-12-04 on Test CPU, 2 cores, Test OS: Python 3.12.1, moetune 0.1.0" in rendered
    assert "Load average (1 minute) as each command started: 0.30." in rendered
    assert "    python3 lab/bench/serve_load.py --each --workers 1 --out $OUT/load.json" in rendered
    assert "| packs | 1 | 40 | 4.5 | 9.5 | 100.0 | 0 | 25: met | 2% | 0.25 |" in rendered
    assert "| packs | 2 | 40 | 4.5 | 31.2 | 100.0 | 0 | 25: missed by 6.2 | 2% | 0.25 |" in rendered
    assert "| mixed: winners | 1 | - | 5.0 | 12.0 | 60.0 | - | - | - | - |" in rendered
    with pytest.raises(ValueError, match="a full table only"):
        tables.render_page(page.replace("full", "summary"), {"service_loopback": service_data(*made)})


BASELINES = {
    "test_gpu": data(entry()),
    "service_loopback": service_data(
        *service.load_entries(run(result(), result(workers=2, p99=31.25, requests_per_s=1234.5), mixed()))
    ),
}


@pytest.mark.parametrize(
    ("name", "field", "options", "text"),
    [
        ("serve_load/clients=50,workers=1/packs", "p99", (), "9.5 ms"),
        ("serve_load/clients=50,workers=1/packs", "p50", (".2f",), "4.50 ms"),
        ("serve_load/clients=50,workers=1/packs", "max", (), "100.0 ms"),
        ("serve_load/clients=50,workers=2/packs", "rps", (), "1,234 requests/s"),
        ("serve_load/clients=50,workers=1/packs", "errors", (), "0"),
        ("serve_load/clients=50,workers=1/packs", "goal:p99", (), "25 ms"),
        ("serve_load/clients=50,workers=1/packs", "over:p99", (), "-15.5 ms"),  # met, 15.5 ms to spare
        ("serve_load/clients=50,workers=2/packs", "over:p99", (), "+6.2 ms"),  # missed by 6.25
        ("serve_load/clients=50,workers=1/mixed", "p99:winners", (), "12.0 ms"),
        ("serve_load/clients=50,workers=1/packs", "warmup", (".2f",), "0.25 s"),
        ("serve_load/clients=50,workers=*/packs", "p99", (), "9.5-31.2 ms"),  # a range over both
    ],
)
def test_each_load_figure_is_quoted_from_its_entry(name, field, options, text):
    assert quoted(f"service_loopback:{name}", field, *options, baselines=BASELINES) == text


def test_an_unprefixed_quote_still_reads_the_only_gpus_file_beside_the_services():
    assert quoted("bench_gemm/gate_up/T=4/balanced", "ms", baselines=BASELINES) == "0.200 ms"


@pytest.mark.parametrize(
    ("quote", "error"),
    [
        ("service_loopback:serve_load/clients=50,workers=1/packs ms", "ms is not a figure of the service's"),
        ("bench_gemm/gate_up/T=4/balanced p99", "p99 is not a figure of a GPU's measurement"),
        ("service_loopback:serve_load/clients=50,workers=1/mixed goal:p99", "no goal (its route has none"),
        ("service_loopback:serve_load/clients=50,workers=1/packs goal:p50", "goals bound p99 only"),
        ("service_loopback:serve_load/clients=50,workers=1/mixed p99:jobs", "no route 'jobs' in its mix"),
        ("service_loopback:serve_load/x p99", "no entry named 'serve_load/x' in the service's loopback"),
    ],
)
def test_a_quote_of_what_the_service_baselines_do_not_hold_is_one_clear_error(quote, error):
    with pytest.raises(quotes.QuoteError, match="page.md:1: ") as raised:
        quotes.render_quotes(f"<!-- q {quote} -->x<!-- /q -->\n", BASELINES, where="page.md")
    assert error in str(raised.value)
