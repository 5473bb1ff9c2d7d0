"""The scripts that compare runs, on small synthetic inputs: merge_packs.py (packs of one device and
kernel source into one), compare_grid.py (a sweep's winners against an exhaustive grid's best) and
compare_clusters.py (the same tuning work on two clusters)."""

from __future__ import annotations

import dataclasses
import datetime

import pytest
from tests.factories import H200, trial

from moetune.db import open_store
from moetune.kernels import packs
from moetune.kernels.problem import Problem
from moetune_lab.bench import compare_clusters, compare_grid, merge_packs

A = Problem("grouped_matmul", m=64, k=128, n=256, g=4)
B = Problem("grouped_matmul", m=128, k=128, n=256, g=4)
T0 = datetime.datetime(2026, 1, 2, 12, 0, 0)


def pack(*entries: tuple[Problem, int, float], source: str = "src1") -> packs.Pack:
    made = tuple(packs.PackEntry(p, {"block_m": block_m}, median) for p, block_m, median in entries)
    return packs.Pack(H200, "mosaic_gpu", source, made, created="2026-01-02T00:00:00Z")


def test_merging_keeps_the_fastest_entry_per_problem_and_the_later_pack_on_a_tie():
    first = pack((A, 64, 2e-3), (B, 64, 1e-3))
    second = pack((A, 128, 1e-3), (B, 128, 1e-3))
    merged, origin = merge_packs.merge([first, second])
    assert {e.problem.key: e.config["block_m"] for e in merged.entries} == {A.key: 128, B.key: 128}
    assert origin == {A.key: 1, B.key: 1}
    merged, origin = merge_packs.merge([first, pack((B, 256, 3e-3))])
    assert {e.problem.key: e.config["block_m"] for e in merged.entries} == {A.key: 64, B.key: 64}
    assert origin == {A.key: 0, B.key: 0}


def test_merging_refuses_packs_of_another_device_backend_or_kernel_source():
    first = pack((A, 64, 1e-3))
    for other in (
        pack((A, 64, 1e-3), source="src2"),
        dataclasses.replace(first, backend="xla"),
        dataclasses.replace(first, device=dataclasses.replace(H200, driver="590.10")),
    ):
        with pytest.raises(SystemExit, match="packs differ in device, backend or kernel source"):
            merge_packs.merge([first, other])


def record(store, sweep_id, problem, block_m, median_s, start_s, worker="w0"):
    return store.record_trial(
        trial(
            config={"block_m": block_m},
            problem=problem,
            backend="mosaic_gpu",
            median_s=median_s,
            sweep_id=sweep_id,
            worker=worker,
            started_at=T0 + datetime.timedelta(seconds=start_s),
            finished_at=T0 + datetime.timedelta(seconds=start_s + 1),
        )
    )


def sweep(
    url: str, times: dict[Problem, dict[int, float]], promote: dict[Problem, int] | None = None
) -> None:
    """A sweep database: every (problem, block_m) timed, and the given configs promoted."""
    with open_store(url) as store:
        sweep_id = store.create_sweep(backend="mosaic_gpu", strategy="grid", spec={}, host="h", user="u")
        start = 0
        for problem, configs in times.items():
            for block_m, median_s in configs.items():
                trial_id = record(store, sweep_id, problem, block_m, median_s, start, worker=f"w{start % 2}")
                start += 1
                if (promote or {}).get(problem) == block_m:
                    store.promote(trial_id)


def test_the_grid_check_says_how_far_each_sweep_winner_is_from_the_grids_best(tmp_path):
    grid, swept = f"sqlite:///{tmp_path / 'grid.db'}", f"sqlite:///{tmp_path / 'sweep.db'}"
    sweep(grid, {A: {64: 1.00e-3, 128: 1.05e-3, 256: 2e-3}, B: {64: 1.0e-3, 128: 2.0e-3}})
    # The sweep's winner of A is the grid's best config; of B, a config 10% slower than the grid's best.
    sweep(swept, {A: {64: 1.01e-3}, B: {128: 1.1e-3, 64: 1.2e-3}}, promote={A: 64, B: 128})
    result = compare_grid.compare(swept, grid, tolerance=0.02)
    rows = {row["problem"]: row for row in result["problems"]}
    assert rows[A.key]["grid_trials"] == 3 and rows[A.key]["within"]
    assert rows[A.key]["gap"] == pytest.approx(0.01)
    assert rows[B.key]["gap"] == pytest.approx(0.1) and not rows[B.key]["within"]
    assert result["within"] == 1


def run(per_minute: float, best: dict[str, tuple[int, float]], times=None) -> dict:
    """A `moetune bench tuner --out` run's Ray half, as compare_clusters reads it."""
    best = {key: {"config": {"block_m": bm}, "median_s": s} for key, (bm, s) in best.items()}
    return {"ray": {"per_minute": per_minute, "best": best}, "times": times or {}}


def test_two_clusters_agree_where_their_best_configs_match_or_time_alike():
    one = run(200.0, {"a": (64, 1.0e-3), "b": (64, 1.0e-3), "c": (64, 1.0e-3)}, {"a": {"x": 1.0, "y": 2.0}})
    two = run(
        380.0, {"a": (64, 1.3e-3), "b": (128, 1.01e-3), "c": (128, 1.5e-3)}, {"a": {"x": 1.05, "y": 3.0}}
    )
    result = compare_clusters.compare(one, two, tolerance=0.02)
    assert result["throughput_ratio"] == pytest.approx(1.9)
    assert {k: p["agree"] for k, p in result["problems"].items()} == {"a": True, "b": True, "c": False}
    assert result["winners_agree"] == 2
    same = result["same_configs"]
    assert same["count"] == 2 and same["off_by_10pct"] == 1 and same["off_by_30pct"] == 1
    assert compare_clusters.compare(one, run(1.0, {}), 0.02)["problems"]["a"] == {
        "agree": False,
        "why": "no ok candidate in the second run",
    }


def test_a_sweep_database_reads_as_a_run_with_its_winners_and_its_rate(tmp_path):
    path = tmp_path / "one_gpu.db"
    sweep(f"sqlite:///{path}", {A: {64: 1e-3, 128: 2e-3}, B: {64: 3e-3, 128: 1e-3}}, promote={A: 128})
    got = compare_clusters.from_database(path, 1)
    assert got["ray"]["variants"] == 4 and got["ray"]["elapsed_s"] == 4.0
    assert got["ray"]["per_minute"] == pytest.approx(60.0) and got["ray"]["workers"] == 2
    # A's promoted winner, though another config timed faster; B's fastest ok trial.
    assert got["ray"]["best"][A.key]["config"] == {"block_m": 128}
    assert got["ray"]["best"][B.key]["config"] == {"block_m": 128}
    assert got["times"][A.key] == {'{"block_m": 128}': 2e-3, '{"block_m": 64}': 1e-3}
