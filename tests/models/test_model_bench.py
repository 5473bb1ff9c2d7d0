"""The model benchmark end to end on the tiny config: the CLI function and the GPU-machine script."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.lookup import LOOKUP
from moetune.models.bench import SCHEMA, run_model_bench
from moetune.tuner.cli.bench_model import bench_model, bench_model_command

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_database():
    with LOOKUP.using_db(None):
        yield


def _positive(value) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


def test_bench_model_writes_the_json_the_lead_publishes(tmp_path, monkeypatch):
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)  # bench_model sets it; undone after
    out = tmp_path / "results" / "model.json"
    result = bench_model("tiny", 1, 8, 2, ["dense", "moetune"], 1, out, moe_tokens=(16,), runs=1)
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(result))
    assert written["schema"] == SCHEMA and written["complete"] and written["ok"]
    assert {"date", "command", "device", "versions"} <= written.keys()
    assert written["device"]["device_kind"] == "cpu" and written["versions"]["jax"]
    assert written["model"]["layers"] == 1 and written["model"]["hidden"] == 64
    # The layer is timed at the requested count and at the model's prefill (1 x 8) and decode (1) counts.
    assert written["moe_tokens"] == [16, 8, 1]
    for path in ("dense", "moetune"):
        entry = written["results"][path]
        for phase, tokens in (("prefill", 8), ("decode", 2)):
            stats = entry[phase]
            assert len(stats["samples_s"]) == 1 and _positive(stats["compile_s"])
            assert stats["tokens_per_s"] == pytest.approx(tokens / stats["median_s"])
        assert [m["tokens"] for m in entry["moe"]] == [16, 8, 1]
        assert all(_positive(m["median_s"]) for m in entry["moe"])
        # Each timed block's rows per expert: T * top_k rows (the tiny model's top_k is 2) in every block.
        for m in entry["moe"]:
            assert len(m["rows_per_expert"]) == m["reps"]
            assert all(sum(rows) == 2 * m["tokens"] and min(rows) >= 0 for rows in m["rows_per_expert"])
    # Both paths route the first block's input identically.
    first = [written["results"][p]["moe"][0]["rows_per_expert"][0] for p in ("dense", "moetune")]
    assert first[0] == first[1]
    parity = written["parity"]["moetune"]
    assert parity["ok"] and parity["logits"]["rel_l2"] < parity["logits"]["tolerance"]
    assert set(parity["moe_layer"]) == {"16", "8", "1"}
    assert set(written["moe_layer_speedup"]["moetune_vs_dense"]) == {"16", "8", "1"}
    # What grouped_matmul picked for each GEMM of the moetune path: gate_up and down per token count.
    dispatch = written["moetune_dispatch"]
    assert len(dispatch) == 6 and {d["backend"] for d in dispatch} == {"xla"}


def test_bad_arguments_fail_before_any_work():
    with pytest.raises(ConfigInvalid, match="unknown MoE path 'fused'"):
        run_model_bench("tiny", 1, 8, 2, ["fused"])
    with pytest.raises(ConfigInvalid, match="batch=0 must be a positive integer"):
        run_model_bench("tiny", 0, 8, 2)


def test_command_fails_with_exit_2_and_one_line_on_bad_input():
    app = typer.Typer()
    app.command("model")(bench_model_command)
    app.command("other")(lambda: None)  # two commands, so "model" stays a subcommand name
    run = CliRunner().invoke(app, ["model", "--model", "mixtral_9x9b"])
    assert run.exit_code == 2
    assert "error: unknown model 'mixtral_9x9b'; known: mixtral_8x7b, tiny" in run.output
    run = CliRunner().invoke(app, ["model", "--model", "tiny", "--moe-tokens", "4096,x"])
    assert run.exit_code == 2 and "--moe-tokens='4096,x' must be comma-separated integers" in run.output


def test_gpu_script_runs_with_only_jax_numpy_and_moetune(tmp_path):
    # The GPU machine has no Ray, Optuna, SQLAlchemy (nor, maybe, Typer): the script must not need them,
    # neither at import nor while tracing the moetune path with --no-db.
    out = tmp_path / "model.json"
    argv = ["--model", "tiny", "--layers", "1", "--batch", "1", "--prompt", "4", "--gen", "2"]
    argv += ["--paths", "moetune", "--moe-tokens", "4", "--runs", "1", "--no-db", "--out", str(out)]
    forbidden = ["ray", "optuna", "sqlalchemy", "alembic", "typer", "rich", "moetune.db", "moetune.tuner.cli"]
    probe = (
        "import runpy, sys\n"
        f"sys.argv = ['bench_model.py', *{argv!r}]\n"
        "try:\n"
        f"    runpy.run_path({str(REPO / 'benchmarks' / 'bench_model.py')!r}, run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    print('exit', e.code)\n"
        f"print('loaded', sorted(m for m in {forbidden!r} if m in sys.modules))\n"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert "exit 0" in run.stdout, run.stdout + run.stderr
    assert "loaded []" in run.stdout, run.stdout
    assert json.loads(out.read_text())["results"]["moetune"]["decode"]["tokens_per_s"] > 0
