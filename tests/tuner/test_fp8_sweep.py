"""A real inline sweep of FP8 problems on the xla backend: compiled, verified against the dequantized
float32 reference, timed, stored and promoted like any 16-bit problem."""

from __future__ import annotations

import pytest

from moetune.kernels.problem import Problem
from moetune.tuner.driver import SweepDriver
from moetune.tuner.executors import InlineExecutor
from moetune.tuner.plan import PlannedProblem
from moetune.tuner.spec import SweepSpec

FP8 = "float8_e4m3fn"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_inline_xla_sweep_tunes_fp8_problems_per_layout(store, db_url):
    problems = [
        Problem("grouped_matmul_fp8", 32, 256, 256, 4, FP8, FP8, scale_layout="block_1x128_128x128"),
        Problem("grouped_matmul_swiglu_fp8", 32, 128, 256, 4, FP8, FP8, scale_layout="row_channel"),
    ]
    planned = [PlannedProblem(p, p.scale_layout) for p in problems]
    # Two strategies keep it short: one XLA formulation against another, the layouts' whole path.
    space = {"strategy": ["ragged_dot", "segments"]}
    spec = SweepSpec(backend="xla", finalists=1, retime_rounds=1, routing="zipf:1.2", space=space)
    sweep_id = store.create_sweep(backend="xla", strategy=spec.strategy, spec={}, host="h", user="u")
    outcome = SweepDriver(store, InlineExecutor(), spec, backend="xla", poll_s=0).run(
        planned, sweep_id=sweep_id
    )
    assert outcome.status == "done"
    trials = store.trials(sweep_id=outcome.sweep_id)
    assert {t.problem for t in trials} == set(problems)  # read back with their layouts
    assert {t.status for t in trials} == {"ok"}, {t.error for t in trials}
    assert len(trials) >= 2 * len(problems)
    for problem in outcome.problems:
        assert problem.winner_config is not None and problem.winner_s and problem.baseline_s
    winners = {w.problem for w in store.winners(backend="xla")}
    assert winners == set(problems)
