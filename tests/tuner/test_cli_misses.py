"""A miss that a later sweep tuned shows as resolved in `moetune misses`, exactly when `tune --misses`
leaves it out: an active winner for its device fingerprint, backend and problem with the current
kernel source."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from moetune.cli import _load_commands, app
from moetune.db import open_store
from moetune.kernels.device import current_fingerprint
from moetune.tuner.plan import parse_problem

_load_commands()
TUNED = "m=16,k=64,n=64,g=4"
UNTUNED = "m=32,k=64,n=64,g=4"


def invoke(*args):
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def misses(url, *flags):
    return {row["problem"]: row for row in json.loads(invoke("misses", *flags, "--json", "--db", url).stdout)}


def test_a_miss_tuned_by_a_later_sweep_is_resolved_and_tune_misses_agrees(sqlite_url):
    tuned, untuned = (parse_problem(p).problem for p in (TUNED, UNTUNED))
    with open_store(sqlite_url) as store:  # dispatch missed both shapes on this machine
        for problem in (tuned, tuned, untuned):
            store.record_miss(device=current_fingerprint(), backend="xla", problem=problem)
    assert {k: r["status"] for k, r in misses(sqlite_url).items()} == {
        tuned.key: "missed",
        untuned.key: "missed",
    }

    flags = ("--backend", "xla", "--budget", "1", "--no-baseline", "--inline")
    invoke("tune", "--problem", TUNED, *flags, "--db", sqlite_url)
    rows = misses(sqlite_url)
    assert (rows[tuned.key]["status"], rows[tuned.key]["count"]) == ("resolved", 2)
    assert rows[untuned.key]["status"] == "missed" and rows[untuned.key]["op"] == "grouped_matmul"
    assert set(misses(sqlite_url, "--unresolved")) == {untuned.key}
    table = invoke("misses", "--db", sqlite_url).stdout
    assert "2 misses (1 resolved" in table and "resolved" in table and "missed" in table

    # `tune --misses` plans exactly the unresolved ones.
    plan = json.loads(invoke("tune", "--misses", *flags, "--dry-run", "--json", "--db", sqlite_url).stdout)
    assert [row["label"] for row in plan["problems"]] == [f"miss x1 {UNTUNED}"]
    invoke("tune", "--misses", *flags, "--db", sqlite_url)
    assert misses(sqlite_url, "--unresolved") == {}
    result = invoke("tune", "--misses", *flags, "--db", sqlite_url)
    assert "every winner is current" in result.output
