"""One vocabulary across the command line: tokens T beside rows m (m = T x top_k), the op of every row,
one time unit per table named in its header, configs by the fields that differ from the default; and
`explain --op`. One real sweep of the tiny model on the xla backend (T=8, top_k=2: m=16) serves them."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from moetune.cli import _load_commands, app
from moetune.kernels.problem import GROUPED_MATMUL, GROUPED_MATMUL_SWIGLU
from moetune.tuner import config_diff
from moetune.tuner.durations import unit_for

_load_commands()


def invoke(*args):
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, (result.output, result.exception)
    return result


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """The db URL and the outcome (--json) of `tune --model tiny --buckets 8 --backend xla`."""
    url = f"sqlite:///{tmp_path_factory.mktemp('vocabulary') / 'moetune.db'}"
    flags = ("--model", "tiny", "--buckets", "8", "--backend", "xla", "--budget", "2", "--no-baseline")
    result = invoke("tune", *flags, "--inline", "--json", "--db", url)
    return url, json.loads(result.stdout)


def row_of(table: str, text: str) -> list[str]:
    """The cells of the row whose first line holds `text`, with the lines a long cell wrapped onto (its
    first cell empty) joined back: which config wins, and so how wide its cell is, varies by run."""
    lines = table.splitlines()
    (start,) = [i for i, line in enumerate(lines) if text in line]
    cells = [cell.strip() for cell in lines[start].split("│")[1:-1]]
    for line in lines[start + 1 :]:
        more = [cell.strip() for cell in line.split("│")[1:-1]]
        if len(more) != len(cells) or more[0]:
            break
        cells = [a + b for a, b in zip(cells, more, strict=True)]
    return cells


def test_tune_gives_tokens_and_rows_and_the_op_of_each_problem(tuned):
    _, outcome = tuned
    rows = {row["op"]: row for row in outcome["problems"]}
    assert set(rows) == {GROUPED_MATMUL_SWIGLU, GROUPED_MATMUL}  # gate_up fused, down plain
    for row in rows.values():
        assert (row["tokens"], row["m"]) == (8, 16) and isinstance(row["k"], int)
        assert isinstance(row["winner"]["config"], dict) and isinstance(row["winner"]["median_s"], float)
        assert isinstance(row["trials"]["ok"], int)


def test_best_has_an_op_column_and_tokens_beside_rows(tuned):
    url, _ = tuned
    rows = json.loads(invoke("best", "--no-packs", "--json", "--db", url).stdout)
    assert sorted((r["problem"]["op"], r["tokens"], r["problem"]["m"]) for r in rows) == [
        (GROUPED_MATMUL, 8, 16),
        (GROUPED_MATMUL_SWIGLU, 8, 16),
    ]
    table = invoke("best", "--no-packs", "--db", url).stdout
    unit = unit_for(r["decided"]["median_s"] for r in rows)
    assert f"times in {unit.name}" in table
    for r in rows:
        cells = row_of(table, r["problem"]["op"] + " ")
        assert cells[2:5] == [r["problem"]["op"], "8", "16"]  # gpu, backend, op, T, m
        assert config_diff.text("xla", r["config"]) in cells  # only what differs from XlaConfig()
        assert unit.format(r["decided"]["median_s"]) in cells


def test_trials_show_tokens_rows_op_and_one_unit(tuned):
    url, _ = tuned
    rows = json.loads(invoke("trials", "--json", "--db", url).stdout)
    assert {(r["op"], r["tokens"], r["m"]) for r in rows} == {
        (GROUPED_MATMUL, 8, 16),
        (GROUPED_MATMUL_SWIGLU, 8, 16),
    }
    table = invoke("trials", "--db", url).stdout
    unit = unit_for(r["median_s"] for r in rows)
    assert f"times in {unit.name}" in table and f"median {unit.name}" in table
    assert "T" in re.split(r"\s*┃\s*", table) and "m" in re.split(r"\s*┃\s*", table)


def test_a_problem_given_by_rows_alone_says_its_tokens_are_unknown(tmp_path):
    url = f"sqlite:///{tmp_path / 'm.db'}"
    flags = ("--problem", "m=16,k=64,n=64,g=4", "--backend", "xla", "--budget", "1", "--no-baseline")
    (row,) = json.loads(invoke("tune", *flags, "--inline", "--json", "--db", url).stdout)["problems"]
    assert (row["tokens"], row["m"]) == (None, 16)
    table = invoke("best", "--no-packs", "--db", url).stdout
    assert "rows m only: T unknown" in table


def test_explain_takes_the_op(tuned):
    url, _ = tuned
    args = ("explain", "--m", "16", "--k", "64", "--n", "128", "--g", "4", "--db", url)
    fused = json.loads(invoke(*args, "--op", GROUPED_MATMUL_SWIGLU, "--json").stdout)
    assert (
        fused["problem"].startswith(f"{GROUPED_MATMUL_SWIGLU}/m=16,") and fused["op"] == GROUPED_MATMUL_SWIGLU
    )
    assert fused["tokens"] is None and fused["m"] == 16
    plain = json.loads(invoke(*args, "--json").stdout)
    assert plain["problem"].startswith(f"{GROUPED_MATMUL}/m=16,")
    text = invoke(*args, "--op", GROUPED_MATMUL_SWIGLU).stdout
    assert "m=16 rows (T unknown" in text
    bad = CliRunner().invoke(app, [*args, "--op", "attention"])
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1 and "'attention' is not one of" in bad.stderr


def test_a_cell_wider_than_the_table_is_folded_whole_not_cut(capsys):
    from moetune.cli.common import emit

    config = ",".join(f"field_{i}=value_{i}" for i in range(30))  # wider than the 200 columns of a pipe
    emit([{"op": "grouped_matmul", "config": config}], as_json=False)
    out = capsys.readouterr().out
    assert "…" not in out and row_of(out, "grouped_matmul")[1] == config
