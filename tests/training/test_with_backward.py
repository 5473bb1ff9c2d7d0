"""`moetune tune --with-backward` (and the sweep file's `with_backward`): the plan adds each forward
problem's backward GEMMs, which are the very Problems jax.grad's backward dispatches."""

from __future__ import annotations

import json
import logging

import jax
import jax.numpy as jnp
import pytest
from typer.testing import CliRunner

from moetune.cli import _load_commands, app
from moetune.kernels import call_op
from moetune.kernels.api import cotangent_problems
from moetune.kernels.problem import Problem
from moetune.tuner.plan import load_model

_load_commands()


def invoke(*args):
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize(
    "problem",
    [
        Problem("grouped_matmul", m=12, k=8, n=16, g=3, lhs_dtype="bf16", rhs_dtype="bf16", out_dtype="f32"),
        Problem(
            "grouped_matmul", m=12, k=8, n=16, g=3, lhs_dtype="f32", rhs_dtype="bf16", transpose_rhs=True
        ),
        Problem("grouped_matmul_swiglu", m=12, k=8, n=16, g=3, lhs_dtype="bf16", rhs_dtype="bf16"),
    ],
    ids=["plain", "transposed-mixed", "swiglu"],
)
def test_the_planned_backward_is_what_jax_grad_dispatches(problem, caplog):
    lhs, rhs, sizes = problem.spec.shape_dtypes(problem)
    lhs = jnp.ones(lhs.shape, lhs.dtype)
    rhs = jnp.full(rhs.shape, 0.1, rhs.dtype)
    sizes = jnp.asarray([5, 0, 4], jnp.int32)

    def loss(a, b):
        out = call_op(problem.op, a, b, sizes, problem.transpose_rhs, problem.out_dtype)
        return out.astype(jnp.float32).sum()

    with caplog.at_level(logging.DEBUG, logger="moetune.kernels.api"):
        jax.grad(loss, (0, 1))(lhs, rhs)
    dispatched = [r.args[0] for r in caplog.records if r.name == "moetune.kernels.api"]
    planned = [problem.key] + [p.key for _, p in cotangent_problems(problem)]
    assert dispatched == planned


def test_dry_run_lists_each_forward_problem_with_its_backward_and_their_ops(sqlite_url):
    args = ["tune", "--model", "tiny", "--buckets", "4", "--backend", "xla", "--dry-run", "--json"]
    plain = json.loads(invoke(*args, "--db", sqlite_url).output)
    result = invoke(*args, "--with-backward", "--db", sqlite_url)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["problems"]
    expected = []
    for planned in load_model("tiny").with_buckets((4,)).problems():
        expected.append((planned.label, planned.problem.op))
        expected += [(f"{planned.label} {part}", p.op) for part, p in cotangent_problems(planned.problem)]
    assert [(r["label"], r["op"]) for r in rows] == expected
    assert len(plain["problems"]) == 2 and len(rows) == 7  # gate_up: product, dlhs, drhs; down: dlhs, drhs
    assert {r["op"] for r in rows} == {"grouped_matmul_swiglu", "grouped_matmul", "grouped_matmul_drhs"}


def test_the_sweep_file_key_asks_for_the_backward(sqlite_url, tmp_path):
    sweep = tmp_path / "train.yaml"
    sweep.write_text("backend: xla\nmodel: tiny\ntoken_buckets: [4]\nwith_backward: true\n")
    result = invoke("tune", "--sweep", str(sweep), "--dry-run", "--json", "--db", sqlite_url)
    assert result.exit_code == 0, result.output
    ops = [r["op"] for r in json.loads(result.output)["problems"]]
    assert ops.count("grouped_matmul_drhs") == 2


@pytest.mark.parametrize(
    "args, message",
    [
        (["--misses"], "with_backward adds the backward of the models' and problems' GEMMs"),
        (["--problem", "op=grouped_matmul_drhs,m=8,k=8,n=8,g=2"], "has no backward to add"),
    ],
    ids=["misses-only", "gradient-op"],
)
def test_bad_combinations_are_one_line_and_exit_2_writing_nothing(tmp_path, args, message):
    db = tmp_path / "never.db"
    result = invoke(
        "tune", *args, "--with-backward", "--backend", "xla", "--inline", "--db", f"sqlite:///{db}"
    )
    assert result.exit_code == 2 and message in result.output
    assert result.output.strip().count("\n") == 0 and result.output.startswith("error: ")
    assert not db.exists()
