"""examples/train_moe.py: a few steps of the small MoE transformer on both paths, on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

from examples.train_moe import TrainConfig, main, train

SMALL = TrainConfig(
    vocab=64, dim=32, heads=2, layers=1, experts=4, top_k=2, ffn=32, seq=16, batch=4, steps=5, log_every=0
)


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


def test_bad_arguments_exit_2():
    for argv in (["--steps", "0"], ["--backend", "mosaic"]):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2
