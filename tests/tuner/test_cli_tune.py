"""`moetune tune` (in-process, without Ray: --inline), `--dry-run`, bad input, and `moetune report`."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from moetune.cli import _load_commands, app
from moetune.db import open_store
from moetune.kernels import registry
from moetune.kernels.device import current_fingerprint
from moetune.kernels.errors import MoetuneError
from moetune.tuner.plan import load_model, parse_problem

_load_commands()
PROBLEM = "m=16,k=64,n=64,g=4,dtype=bf16"


def invoke(*args):
    return CliRunner().invoke(app, list(args))


def valid_configs(problem):
    space = registry.get("xla").search_space(problem, current_fingerprint())
    return space.enumerate(problem, current_fingerprint())


def test_dry_run_shows_problems_times_candidates_after_pruning(sqlite_url):
    result = invoke("tune", "--model", "tiny", "--backend", "xla", "--dry-run", "--json", "--db", sqlite_url)
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    problems = load_model("tiny").problems()
    assert [row["label"] for row in plan["problems"]] == [p.label for p in problems]
    for row, planned in zip(plan["problems"], problems, strict=True):
        valid, pruned = valid_configs(planned.problem)
        assert (row["valid"], row["pruned"], row["to_run"]) == (len(valid), len(pruned), len(valid))
        # T beside m, and the op: a shape's two GEMMs never look alike.
        assert (row["op"], row["tokens"], row["m"]) == (planned.problem.op, planned.tokens, planned.problem.m)
    assert plan["candidates"] == sum(len(valid_configs(p.problem)[0]) for p in problems)
    assert plan["estimate_s"] > 0 and plan["estimate_measured"] is False
    table = invoke(
        "tune", "--model", "tiny", "--backend", "xla", "--budget", "3", "--dry-run", "--db", sqlite_url
    )
    assert table.exit_code == 0 and re.search(r"12 candidates; estimated", table.output)
    header = next(line for line in table.output.splitlines() if "problem" in line and "valid" in line)
    assert re.search(r"\bop\b.*\bT\b.*\bm\b.*k,n,g", header), header


def test_decode_block_adds_the_blocks_problems_at_the_decode_buckets(sqlite_url):
    args = ("tune", "--model", "qwen3-30b-a3b", "--buckets", "1,8,64", "--backend", "xla")
    result = invoke(*args, "--decode-block", "--dry-run", "--json", "--db", sqlite_url)
    assert result.exit_code == 0, result.output
    rows = [r for r in json.loads(result.output)["problems"] if r["op"] == "moe_decode_block"]
    assert [(r["label"], r["tokens"], r["m"]) for r in rows] == [
        ("qwen3-30b-a3b block T=1", 1, 1),
        ("qwen3-30b-a3b block T=8", 8, 8),
    ]  # 64 tokens are past the block's 32


def test_inline_sweep_prints_winners_and_report_is_self_contained(sqlite_url, tmp_path):
    result = invoke(
        "tune",
        "--problem",
        PROBLEM,
        "--backend",
        "xla",
        "--budget",
        "3",
        "--inline",
        "--json",
        "--db",
        sqlite_url,
    )
    assert result.exit_code == 0, result.output
    outcome = json.loads(result.output[result.output.index("{") :])
    [row] = outcome["problems"]
    assert row["winner"]["config"] and row["xla"]["median_s"] > 0 and row["heuristic"]["median_s"] > 0
    with open_store(sqlite_url) as store:
        trials = store.trials(sweep_id=outcome["sweep_id"])
        assert len(trials) == 3 and all(t.status == "ok" for t in trials)
        stored = store.get_sweep(outcome["sweep_id"]).spec
        assert stored["problems"][0]["problem"] == parse_problem(PROBLEM).problem.to_dict()
        assert stored["spec"]["backend"] == "xla" and stored["spec"]["db"] is None  # no URL, no password

    out = tmp_path / "report.html"
    report = invoke("report", str(outcome["sweep_id"]), "--out", str(out), "--db", sqlite_url)
    assert report.exit_code == 0, report.output
    html = out.read_text()
    assert html.count('class="plotly-graph-div"') >= 2 and "Winners" in html and "m=16,k=64,n=64,g=4" in html
    body = html.split("</head>", 1)[1]  # the head is plotly.js itself, whose code names its web site
    assert not re.search(r"(src|href)=\"?https?:", body) and "<script src" not in html  # nothing fetched


@pytest.mark.parametrize(
    "args, message",
    [
        (["--backend", "xla"], "nothing to tune"),
        (["--problem", PROBLEM, "--routing", "skewed"], "routing 'skewed'"),
        (["--problem", PROBLEM, "--strategy", "annealing", "--dry-run"], "'annealing' is not one of 'grid'"),
        (["--problem", "m=16,k=64", "--dry-run"], "missing n, g"),
        (["--model", "nope", "--dry-run"], "unknown model 'nope'"),
        (["--problem", PROBLEM, "--backend", "mosaic_gpu", "--dry-run"], "cannot run on cpu"),
        (["--resume", "3", "--budget", "4"], "--resume keeps the sweep's own settings; drop budget"),
        (["--resume", "99", "--inline"], "no sweep with id 99"),
        (["--sweep", "no-such-sweep"], "no sweep file"),
        (["--problem", PROBLEM, "--decode-block", "--dry-run"], "decode_block adds the fused decode block"),
        (
            ["--model", "deepseek-v3-ep8", "--decode-block", "--dry-run"],
            "no model here runs the fused decode",
        ),
        (
            ["--model", "tiny", "--decode-block", "--with-backward", "--dry-run"],
            "drop with_backward or decode_block",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(sqlite_url, args, message):
    inline = [] if "--inline" in args else ["--inline"]  # no test here may start Ray
    result = invoke("tune", *args, *inline, "--db", sqlite_url)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_compile_only_through_the_cli(sqlite_url, sim):
    args = ["tune", "--backend", "sim", "--compile-only", "--problem", PROBLEM, "--db", sqlite_url]
    result = invoke(*args, "--inline")
    assert result.exit_code == 0, result.output
    assert "compile-only sweep 1 (sim for sim-arch)" in result.output
    assert re.search(r"5 ok, 1 compile_error, 2 pruned\s+.*4 worth timing, 1 duplicates", result.output)
    with open_store(sqlite_url) as store:
        trials = store.trials()
    assert {t.device_kind for t in trials} == {"sim-arch (compile-only)"}
    assert all(t.routing is None and t.details["target"] == "sim-arch" for t in trials)
    assert invoke(*args, "--arch", "gfx942", "--inline").output.count("not one of sim-arch") == 1
    assert "use grid or random" in invoke(*args, "--strategy", "tpe", "--inline").output


def test_a_sweep_space_outside_the_backends_domains_fails_before_any_sweep_is_written(sqlite_url, tmp_path):

    sweep = tmp_path / "narrow.yaml"
    sweep.write_text(f"backend: xla\nproblem: {PROBLEM}\nspace: {{strategy: [ragged_dot, magic]}}\n")
    result = invoke("tune", "--sweep", str(sweep), "--inline", "--db", sqlite_url)
    assert result.exit_code == 2 and "not a non-empty subset" in result.output, result.output
    with open_store(sqlite_url) as store:
        with pytest.raises(MoetuneError, match="no sweep"):
            store.get_sweep(1)
    sweep.write_text(f"backend: xla\nproblem: {PROBLEM}\nstrategy: grid\nspace: {{strategy: [ragged_dot]}}\n")
    result = invoke("tune", "--sweep", str(sweep), "--inline", "--no-baseline", "--db", sqlite_url)
    assert result.exit_code == 0, result.output
    with open_store(sqlite_url) as store:
        assert {t.config["strategy"] for t in store.trials()} == {"ragged_dot"}


def test_stale_or_misses_with_nothing_to_do_is_not_an_error(sqlite_url):
    for args in (["--stale"], ["--misses"], ["--stale", "--dry-run"]):
        result = invoke("tune", *args, "--backend", "xla", "--inline", "--db", sqlite_url)
        assert result.exit_code == 0, result.output
        assert "every winner is current" in result.output


def test_nothing_to_tune_as_json_is_an_empty_outcome(sqlite_url):
    result = invoke("tune", "--stale", "--backend", "xla", "--inline", "--json", "--db", sqlite_url)
    assert result.exit_code == 0, result.output
    outcome = json.loads(result.stdout)
    assert outcome["sweep_id"] is None and outcome["problems"] == [] and outcome["nothing_to_tune"]
