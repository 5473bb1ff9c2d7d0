"""lab/bench/sweep_timeline.py on small sweep databases, with the trials' phase times and without them
(databases from before trials recorded their phases)."""

from __future__ import annotations

import datetime
import json

import pytest
from tests.factories import trial

from moetune.db import open_store
from moetune.kernels.problem import Problem
from moetune.tuner.candidate import PHASES
from moetune_lab.bench import sweep_timeline

T0 = datetime.datetime(2026, 11, 29, 12, 0, 0)
A = Problem("grouped_matmul", m=64, k=32, n=64, g=4)
B = Problem("grouped_matmul", m=128, k=32, n=64, g=4)


def phases(setup: float, **others: float) -> dict[str, float]:
    parts = {"setup_inputs_s": setup / 4, "setup_reference_s": setup / 4} if setup else {}
    return dict.fromkeys(PHASES, 0.0) | {"setup_s": setup, "lane_wait_s": 1.0} | parts | others


def record(store, sweep_id, worker, problem, start_s, end_s, **details):
    store.record_trial(
        trial(
            config={"block_m": int(start_s * 8) + 8, "block_n": 128},
            problem=problem,
            sweep_id=sweep_id,
            worker=worker,
            compile_s=0.5,
            started_at=T0 + datetime.timedelta(seconds=start_s),
            finished_at=T0 + datetime.timedelta(seconds=end_s),
            details=details or None,
        )
    )


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_phases_split_by_a_workers_first_trial_of_a_problem_and_idle_workers(store, db_url, capsys):
    sweep_id = store.create_sweep(backend="fake", strategy="grid", spec={}, host="h", user="u")
    # w0: A first (set-up 8 s), A again, then B first; busy 2+3+10 = 15 of 20 s. w1: one trial, no span idle.
    record(store, sweep_id, "w0", A, 0, 10, phases=phases(8.0, verify_s=0.2))
    record(store, sweep_id, "w0", A, 12, 14, phases=phases(0.0, verify_s=0.4))
    record(store, sweep_id, "w0", B, 17, 20, phases=phases(2.0, verify_s=0.6))
    record(store, sweep_id, "w1", B, 1, 5, target="gfx942")  # details without phases (compile-only)
    result = sweep_timeline.timeline(db_url, sweep_id)
    first, later = result["first_trial_of_a_problem_on_a_worker"], result["later_trials"]
    assert first["count"] == 3 and later["count"] == 1
    assert first["phases"]["setup_s"] == {"count": 2, "median_s": 5.0, "total_s": 10.0}
    assert later["phases"]["setup_s"] == {"count": 1, "median_s": 0.0, "total_s": 0.0}
    assert first["phases"]["verify_s"]["total_s"] == pytest.approx(0.8)
    assert first["phases"]["lane_wait_s"]["median_s"] == 1.0
    w0, w1 = result["worker_idle"]["w0"], result["worker_idle"]["w1"]
    assert (w0["span_s"], w0["busy_s"], w0["idle_fraction"]) == (20.0, 15.0, 0.25)
    assert w1["idle_fraction"] == 0.0
    assert result["idle_fraction"] == pytest.approx(5.0 / 24.0)
    sweep_timeline._print(result)
    out = capsys.readouterr().out
    assert "setup_reference_s" in out and "w0" in out and "idle 25%" in out


def test_a_database_from_before_phases_reads_and_prints(tmp_path, monkeypatch, capsys):
    db = tmp_path / "old.db"
    with open_store(f"sqlite:///{db}") as store:
        sweep_id = store.create_sweep(backend="fake", strategy="tpe", spec={}, host="h", user="u")
        for worker, problem, start_s, end_s in (("w0", A, 0, 4), ("w1", A, 1, 3), ("w0", B, 6, 9)):
            record(store, sweep_id, worker, problem, start_s, end_s)  # no details: no phases, no lanes
    monkeypatch.setattr("sys.argv", ["sweep_timeline.py", str(db)])
    sweep_timeline.main()
    out = capsys.readouterr().out
    assert "no phase times recorded" in out and "workers idle between trials" in out
    monkeypatch.setattr("sys.argv", ["sweep_timeline.py", str(db), "--json"])
    sweep_timeline.main()
    result = json.loads(capsys.readouterr().out)
    assert result["later_trials"]["phases"] == {} and result["trials"] == 3
    assert result["worker_idle"]["w0"]["idle_fraction"] == pytest.approx(2 / 9)  # idle 4-6 s of 0-9 s


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_workers_that_held_the_device_at_once_are_put_on_different_lanes(store, db_url):
    sweep_id = store.create_sweep(backend="fake", strategy="grid", spec={}, host="h", user="u")
    # Device phases (verify + time, ending at the result): w0 8-10 s, w1 9-10 s (overlaps w0: another
    # lane), w2 12-14 s (overlaps neither: w0's lane, the first that fits).
    record(store, sweep_id, "w0", A, 0, 10, phases=phases(0.0, verify_s=1.0, time_s=1.0))
    record(store, sweep_id, "w1", A, 0, 10, phases=phases(0.0, verify_s=1.0))
    record(store, sweep_id, "w2", B, 0, 14, phases=phases(0.0, time_s=2.0))
    lanes = sweep_timeline.timeline(db_url, sweep_id)["lanes"]
    assert [lane["workers"] for lane in lanes] == [["w0", "w2"], ["w1"]]
    assert lanes[0]["busy_fraction"] == pytest.approx(4.0 / 14.0)
    assert lanes[0]["busy_per_bin"] == [0.0, 0.4, 0.4]  # 8-10 s in the second 5 s, 12-14 s in the third


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_recorded_lanes_win_over_the_inference(store, db_url):
    sweep_id = store.create_sweep(backend="fake", strategy="grid", spec={}, host="h", user="u")
    # Never at the device together, so inference would put both on one lane; the trials say otherwise.
    record(store, sweep_id, "w0", A, 0, 4, phases=phases(0.0, time_s=1.0), lane="h:gpu0")
    record(store, sweep_id, "w1", A, 0, 9, phases=phases(0.0, time_s=1.0), lane="h:gpu1")
    lanes = sweep_timeline.timeline(db_url, sweep_id)["lanes"]
    assert [lane["workers"] for lane in lanes] == [["w0"], ["w1"]]
