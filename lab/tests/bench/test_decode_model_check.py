"""lab/bench/decode_model_check.py on a small sweep database: fused decode-block trials whose details
hold their kernels' times, beside the cost model's estimate of each kernel."""

from __future__ import annotations

import dataclasses

import pytest
from tests.factories import H200, trial

from moetune.db import open_store
from moetune.kernels.backends.mosaic_gpu import cost_model_decode, space_decode
from moetune.kernels.problem import Problem
from moetune_lab.bench import decode_model_check

# Qwen3-30B-A3B's block at one token.
BLOCK = Problem("moe_decode_block", m=1, k=2048, n=1536, g=128, top_k=8)


def test_spearman_ranks_orders_alike_and_unlike():
    assert decode_model_check.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert decode_model_check.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert decode_model_check.spearman([1, 2], [1, 2]) is None  # too few to rank
    assert decode_model_check.spearman([1, 1, 1], [1, 2, 3]) is None  # no spread
    # Tied values share their mean rank: ranks 0.5, 0.5, 2, 3 against 0, 1, 2, 3.
    assert decode_model_check.spearman([5, 5, 7, 9], [1, 2, 3, 4]) == pytest.approx(0.9486833)


def test_each_kernels_measured_time_is_set_beside_its_estimate(tmp_path, capsys):
    # Three configs the model tells apart in both kernels: narrower tiles, fewer bytes in flight.
    heuristic = space_decode.heuristic(BLOCK, H200)
    configs = [
        dataclasses.replace(heuristic, block_f=f, block_h=h) for f, h in ((16, 32), (32, 64), (64, 256))
    ]
    estimates = [cost_model_decode.estimate(BLOCK, c.decode_config(), H200) for c in configs]
    assert len({e.up.seconds for e in estimates}) == len({e.down.seconds for e in estimates}) == 3
    # Kernel 1 measures 1.5x its estimate; kernel 2 2x, but the first two configs swap their places.
    down = [2 * e.down.seconds for e in estimates]
    down[0], down[1] = down[1], down[0]
    url = f"sqlite:///{tmp_path / 'sweep.db'}"
    with open_store(url) as store:
        for config, estimate, down_s in zip(configs, estimates, down, strict=True):
            kernels = [["moetune_decode_up", 1.5 * estimate.up.seconds], ["moetune_decode_down", down_s]]
            kernels.append(["copy_fusion", 1e-6])
            store.record_trial(
                trial(
                    problem=BLOCK, backend="mosaic_gpu", config=config.to_dict(), details={"kernels": kernels}
                )
            )
        # Neither the unfused baseline nor a trial without kernel times is a row.
        baseline = space_decode.BASELINE.to_dict()
        store.record_trial(
            trial(problem=BLOCK, backend="mosaic_gpu", config=baseline, details={"kernels": []})
        )
        store.record_trial(trial(problem=BLOCK, backend="mosaic_gpu", config=configs[0].to_dict()))
    result = decode_model_check.main([str(tmp_path / "sweep.db"), "--json"])
    assert len(result["rows"]) == 3
    summary = result["summary"][BLOCK.key]
    assert summary["up"]["trials"] == 3
    assert summary["up"]["ratio_median"] == pytest.approx(1.5)
    assert summary["up"]["ratio_min"] == pytest.approx(1.5) == summary["up"]["ratio_max"]
    assert summary["down"]["ratio_median"] == pytest.approx(2.0, rel=0.5)
    assert summary["other_median_s"] == pytest.approx(1e-6)
    assert summary["up"]["spearman"] == pytest.approx(1.0)
    assert summary["down"]["spearman"] == pytest.approx(0.5)  # ranks 1, 0, 2 against 0, 1, 2
    decode_model_check.main([str(tmp_path / "sweep.db")])
    printed = capsys.readouterr().out
    assert "measured/estimated median 1.50" in printed and "other launches: 1.0 us" in printed


def test_a_database_without_block_trials_or_no_database_is_one_line(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    with open_store(url) as store:
        store.record_trial(trial())
    with pytest.raises(SystemExit) as exit_:
        decode_model_check.main([str(tmp_path / "empty.db")])
    assert exit_.value.code == 1
    assert capsys.readouterr().err.strip() == "no fused decode-block trial with kernel times in that database"
    with pytest.raises(SystemExit) as exit_:
        decode_model_check.main([str(tmp_path / "missing.db")])
    assert exit_.value.code == 2 and "no such database" in capsys.readouterr().err
