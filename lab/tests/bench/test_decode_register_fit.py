"""decode_register_fit.py: the features a thread of kernel 2 holds, and the fit that leaves the configs at
the register ceiling out (their count is the cap, not the need)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from moetune_lab.bench import decode_register_fit as fit


def test_a_thread_holds_its_share_of_the_accumulator_and_the_weight_tile():
    # 32 tokens, 256 x 256 tiles on 4 warps (128 threads): 32 x 256 / 128 and 256 x 256 / 128 values.
    assert fit.features(32, 256, 256, 4) == (1.0, 64.0, 512.0)
    # Fewer tokens than the dot's 16 rows still hold 16 rows of accumulator.
    assert fit.features(1, 64, 128, 8) == (1.0, 4.0, 32.0)


def test_the_fit_recovers_the_counts_below_the_ceiling_and_ignores_the_capped_ones():
    truth = np.array([60.0, 2.5, 0.125])
    rows = []
    for tokens, side_h, side_fd, warps in itertools.product((8, 32), fit.SIDES, fit.SIDES, fit.WARPS):
        registers = float(np.dot(fit.features(tokens, side_h, side_fd, warps), truth))
        capped = min(255.0, registers)
        rows.append({"tokens": tokens, "block_h": side_h, "block_fd": side_fd, "warps": warps,
                     "registers": capped})  # fmt: skip
    assert any(r["registers"] >= fit.CEILING for r in rows)
    coefficients, rms, largest = fit.fit(rows)
    np.testing.assert_allclose(coefficients, truth, rtol=1e-9)
    assert rms == pytest.approx(0.0, abs=1e-9) and largest == pytest.approx(0.0, abs=1e-9)
