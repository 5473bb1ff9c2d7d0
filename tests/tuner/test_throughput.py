"""`moetune bench tuner`'s measurement: the same candidates on Ray and one by one in-process."""

from __future__ import annotations

import dataclasses

import pytest

from moetune.tuner.spec import SweepSpec
from moetune.tuner.sweep_setup import model_problems
from moetune.tuner.throughput import measure

pytestmark = pytest.mark.slow


def test_ray_and_sequential_runs_time_the_same_candidates(ray_cluster):
    spec = SweepSpec(backend="xla", models=("tiny",), token_buckets=(8,), budget=2, workers=2)
    result = measure(spec, model_problems(spec))
    assert result.problems == 2 and result.backend == "xla"
    for mode in (result.ray, result.sequential):
        assert mode.variants == 4 and mode.statuses == {"ok": 4}
        assert mode.per_minute > 0 and mode.mean_compile_s > 0
    assert result.ray.workers == 2 and result.sequential.workers == 1
    assert result.to_dict()["speedup"] == pytest.approx(result.ray.per_minute / result.sequential.per_minute)


def test_the_one_by_one_run_can_take_the_first_candidates_only_and_each_mode_reports_its_best(ray_cluster):
    spec = SweepSpec(backend="xla", models=("tiny",), token_buckets=(8,), budget=3, workers=2)
    result = measure(spec, model_problems(spec), sequential_budget=1)
    assert result.ray.variants == 6 and result.sequential.variants == 2
    keys = {p.problem.key for p in model_problems(spec)}
    for mode in (result.ray, result.sequential):
        assert set(mode.best) == keys
        assert all(best["median_s"] > 0 and best["config"] for best in mode.best.values())
    # Without the one-by-one run: one candidate per problem is enough to show that it was left out.
    only_ray = measure(dataclasses.replace(spec, budget=1), model_problems(spec), sequential=False)
    assert only_ray.ray.variants == 2
    assert only_ray.sequential.variants == 0 and only_ray.speedup == 0.0
