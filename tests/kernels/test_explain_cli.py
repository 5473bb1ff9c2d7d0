"""`moetune explain` (cli/explain.py): the dispatch decision for a shape, as text and JSON."""

from __future__ import annotations

import json

import pytest
import typer
from click.testing import CliRunner

import moetune.cli.explain  # noqa: F401 - registers the command
from moetune.cli import app
from moetune.kernels.backends.xla import BACKEND, XlaConfig
from moetune.kernels.device import current_fingerprint
from moetune.kernels.problem import Problem

# As a group, so `explain` is a subcommand whichever other commands are loaded.
CLI = typer.main.get_group(app)
SHAPE = ["--m", "100", "--k", "32", "--n", "16", "--g", "4"]


def run(*args: str):
    return CliRunner().invoke(CLI, ["explain", *SHAPE, *args])


def test_text_output_without_winners():
    result = run()
    assert result.exit_code == 0, result.output
    assert (
        "problem:  grouped_matmul/m=100,k=32,n=16,g=4,lhs=bfloat16,rhs=bfloat16,out=bfloat16,t=0/v1"
        in result.output
    )
    assert "backend:  xla (highest-priority backend available on this device)" in result.output
    assert "source:   heuristic" in result.output


def test_json_with_a_database_winner_nearby(sqlite_url):
    from moetune.db import open_store
    from moetune.db.records import TrialRecord

    problem = Problem("grouped_matmul", m=128, k=32, n=16, g=4, transpose_rhs=True)
    config = XlaConfig(strategy="segments")
    with open_store(sqlite_url) as store:
        trial = store.record_trial(
            TrialRecord(
                sweep_id=None,
                device=current_fingerprint(),
                backend="xla",
                family="xla",
                source_hash=BACKEND.source_hash(),
                problem=problem,
                config=config.to_dict(),
                status="ok",
                samples_s=(1e-3,),
                median_s=1e-3,
            )
        )
        store.promote(trial, reason="test")
    result = run("--transpose-rhs", "--db", sqlite_url, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["problem"].endswith(",t=1/v1")
    assert (data["source"], data["from_m"], data["config"], data["stale"]) == (
        "db nearest",
        128,
        config.to_dict(),
        [],
    )
    assert (data["backend"], data["median_s"]) == ("xla", 1e-3)
    with open_store(sqlite_url) as store:
        assert store.misses() == []  # explain is a query, not a miss


def test_a_named_backend_that_cannot_run_is_one_line_and_exit_code_2(probe_backends):
    probe_backends("absent", priority=3, unavailable="needs a GPU")
    result = run("--backend", "absent", "--dtype", "f32")
    assert result.exit_code == 2
    [line] = result.output.strip().splitlines()
    assert line.startswith("error: backend absent (backend argument) cannot run grouped_matmul/m=100,")
    assert "needs a GPU; pass fallback=True" in line


def test_declined_backends_are_listed_with_fallback(probe_backends):
    probe_backends("absent", priority=3, unavailable="needs a GPU")
    result = run("--backend", "absent", "--fallback", "--dtype", "f32")
    assert result.exit_code == 0, result.output
    assert "backend:  xla (backend argument)" in result.output  # xla runs it; absent was the one asked
    assert "declined: absent: needs a GPU" in result.output
    assert "lhs=float32" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dtype", "int8"], "'--dtype': Value error, 'int8' is not one of 'bf16'"),
        (["--backend", "nope"], "unknown backend 'nope'"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(args, message):
    result = run(*args)
    assert result.exit_code == 2
    assert message in result.output


BLOCK = ["--op", "moe_decode_block", "--m", "8", "--k", "64", "--n", "64", "--g", "8", "--top-k", "2"]


def test_the_decode_block_names_its_tokens_top_k_and_what_moe_mlp_runs():
    result = CliRunner().invoke(CLI, ["explain", *BLOCK])
    assert result.exit_code == 0, result.output
    assert "call:     moe_decode_block, T=8 tokens x top_k=2, H=64, 2F=64, E=8" in result.output
    assert (
        "problem:  moe_decode_block/m=8,k=64,n=64,g=8,lhs=bfloat16,rhs=bfloat16,out=bfloat16,t=0,top_k=2/v3"
        in (result.output)
    )
    assert "moe_mlp:  the unfused path (not on a GPU)" in result.output
    data = json.loads(CliRunner().invoke(CLI, ["explain", *BLOCK, "--json"]).output)
    assert (data["op"], data["tokens"], data["moe_mlp"]) == (
        "moe_decode_block",
        8,
        {"path": "the unfused path", "reason": "not on a GPU"},
    )
    for args, message in (
        (BLOCK[:-2], "routes its tokens: it takes top_k"),
        (BLOCK[2:], "op=grouped_matmul takes no top_k"),
    ):
        refused = CliRunner().invoke(CLI, ["explain", *args])
        assert refused.exit_code == 2 and message in refused.output


def test_on_a_hopper_gpu_a_tuned_block_is_named_with_its_config_and_why(sqlite_url, monkeypatch):
    import sys

    from moetune.db import open_store
    from moetune.db.records import TrialRecord
    from moetune.kernels import registry
    from moetune.kernels.backends.mosaic_gpu.kernel_decode import DecodeBlockConfig
    from moetune.kernels.device import DeviceFingerprint
    from moetune.kernels.moe import layer

    hopper = DeviceFingerprint("NVIDIA H200", "gpu", 132, 150 << 30, "9.0", "", "", "", "")
    api = sys.modules["moetune.kernels.api"]
    monkeypatch.setattr(api, "current_fingerprint", lambda: hopper)
    monkeypatch.setattr(layer, "current_fingerprint", lambda: hopper)
    mosaic = registry.get("mosaic_gpu")
    block = Problem("moe_decode_block", 8, 64, 64, 8, top_k=2)
    config = DecodeBlockConfig(block_f=16, block_k=32, block_h=32, block_fd=32)
    with open_store(sqlite_url) as store:
        trial = store.record_trial(
            TrialRecord(
                sweep_id=None, device=hopper, backend="mosaic_gpu", family=block.op,
                source_hash=mosaic.source_hash(), problem=block, config=config.to_dict(), status="ok",
                samples_s=(2e-5,), median_s=2e-5,
            )
        )  # fmt: skip
        store.promote(trial, reason="test")
    result = CliRunner().invoke(CLI, ["explain", *BLOCK, "--db", sqlite_url])
    assert result.exit_code == 0, result.output
    assert "backend:  mosaic_gpu (highest-priority backend available on this device)" in result.output
    assert f"config:   {config}" in result.output and "source:   db exact, tuned at 0.02 ms" in result.output
    assert (
        "moe_mlp:  the fused block (the db exact winner: the block was timed faster than the unfused path)"
        in result.output
    )
