"""examples/train_moe.py: a few steps of the small MoE transformer on both paths, on the CPU."""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest

from examples.train_moe import TrainConfig, main, train

pytestmark = pytest.mark.slow  # the second tier: seconds per case on a CPU

SMALL = TrainConfig(
    vocab=64, dim=32, heads=2, layers=1, experts=4, top_k=2, ffn=32, seq=16, batch=4, steps=5, log_every=0
)
# SMALL's model on the command line (its vocab is the example's own, 256).
SMALL_FLAGS = ["--dim", "32", "--heads", "2", "--layers", "1", "--experts", "4", "--ffn", "32"]
SMALL_FLAGS += ["--seq", "16", "--batch", "4", "--steps", "5"]


def test_moetune_and_xla_paths_train_alike():
    xla, auto = train(SMALL, "xla"), train(SMALL, "auto")
    # Same parameters, same batches, float32 throughout: the paths differ only in how each GEMM sums
    # (and moetune's SwiGLU backward recomputing its product), rounding of ~1e-7 relative per product.
    # Five adamw steps keep that far below 1e-4 of a loss near log(64); a wrong gradient on either path
    # moves the second step's loss by orders of magnitude more.
    np.testing.assert_allclose(auto["losses"], xla["losses"], rtol=1e-4)
    assert xla["losses"][-1] < xla["losses"][0]  # it learns
    for result in (xla, auto):
        assert len(result["losses"]) == SMALL.steps and result["step_s"] > 0
        assert result["tokens_per_s"] == pytest.approx(SMALL.batch * SMALL.seq / result["step_s"])


def test_json_holds_every_timed_step_and_where_it_ran_and_makes_a_baselines_entry(capsys):
    runs = []
    for backend in ("auto", "xla"):
        main([*SMALL_FLAGS, "--backend", backend, "--log-every", "2", "--json"])
        out, err = capsys.readouterr()
        assert "loss" in err  # the loss lines go to stderr: stdout is the JSON object alone
        runs.append(json.loads(out))
    for run in runs:
        times = run["step_times_s"]
        assert len(times) == SMALL.steps - 1 and all(t > 0 for t in times)  # the compiling step apart
        assert run["first_step_s"] > 0 and run["step_s"] == statistics.median(times)
        assert run["tokens_per_s"] == pytest.approx(SMALL.batch * SMALL.seq / run["step_s"])
        assert len(run["losses"]) == SMALL.steps and run["config"]["dim"] == SMALL.dim
        assert run["device"]["device_kind"] == "cpu" and {"jax", "jaxlib", "optax"} <= set(run["versions"])
        assert run["command"].startswith("python3 examples/train_moe.py --dim 32 ")
    # What moetune dispatched when the first step traced the model: every GEMM of the forward and the
    # backward, on this CPU's xla backend; the ragged_dot path dispatches nothing of moetune's.
    ops = {kernel["problem"].split("/")[0] for kernel in runs[0]["kernels"]}
    assert {"grouped_matmul_drhs", "grouped_matmul"} <= ops and runs[1]["kernels"] == []
    assert {kernel["backend"] for kernel in runs[0]["kernels"]} == {"xla"}


@pytest.mark.parametrize(
    "argv",
    [["--steps", "0"], ["--backend", "mosaic"], ["--dim", "30", "--heads", "4"], ["--top-k", "9"]],
    ids=["no-steps", "unknown-backend", "heads-not-dividing-dim", "top-k-over-experts"],
)
def test_bad_arguments_exit_2(argv):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
