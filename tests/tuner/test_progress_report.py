"""What people see: the live panel, the summary lines, and the HTML report of a sweep with failures."""

from __future__ import annotations

import re

from rich.console import Console

from moetune.kernels.device import DeviceFingerprint
from moetune.tuner.driver import SweepDriver
from moetune.tuner.executors import InlineExecutor
from moetune.tuner.plan import parse_problem
from moetune.tuner.progress import LineProgress, RichProgress, Snapshot, summary_line
from moetune.tuner.report import render
from moetune.tuner.spec import SweepSpec
from tests.tuner import sim_backend

SNAPSHOT = Snapshot(
    elapsed_s=60.0,
    recorded=10,
    planned=30,
    counts={"ok": 8, "crashed": 2},
    lanes={"node-a:gpu0": "mixtral gate_up T=64 tile=2", "node-a:gpu1": "idle"},
    best=[("mixtral gate_up T=64", 1.0e-3, 1.5e-3, {"tile": 2}), ("mixtral down T=64", None, None, None)],
    workers=8,
)


def test_summary_line_has_rate_and_eta():
    line = summary_line(SNAPSHOT)
    assert line.startswith("10/30 trials (crashed=2 ok=8), 10.0/min on 8 workers")
    assert "ETA 2:00" in line  # 20 left at 10 per minute


def test_live_panel_has_one_lane_per_device_and_best_so_far():
    console = Console(record=True, width=140)
    progress = RichProgress(console=console)
    progress.start(SNAPSHOT)
    progress.close(SNAPSHOT)
    text = console.export_text()
    assert "node-a:gpu0" in text and "mixtral gate_up T=64 tile=2" in text and "node-a:gpu1" in text
    assert re.search(r"mixtral gate_up T=64\s+│\s+1\s+│\s+1.5\s+│\s+1.50x", text)


def test_line_progress_prints_at_most_every_interval():
    console = Console(record=True, width=200)
    progress = LineProgress(console=console, every_s=3600)
    for _ in range(3):
        progress.update(SNAPSHOT)
    progress.close(SNAPSHOT)
    assert console.export_text().count("10/30 trials") == 2  # the first update and the close


def test_report_of_a_sweep_with_failures(store, sim):
    sim_backend.COSTS.update({1: 2e-3, 2: None, 3: 1e-3, 4: None, 5: 1.5e-3})
    device = DeviceFingerprint("Simulated GPU", "gpu", 4, 1 << 30, "9.0", "1", "1", "0", "0")
    planned = [parse_problem("m=8,k=64,n=64,g=4"), parse_problem("m=32,k=64,n=64,g=4")]
    spec = {
        "spec": {"routing": "balanced"},
        "problems": [p.to_dict() for p in planned],
        "device": device.to_dict(),
    }
    sweep_id = store.create_sweep(backend="sim", strategy="grid", spec=spec, host="h", user="u")
    driver = SweepDriver(
        store, InlineExecutor(sim_backend.simulate, device), SweepSpec(backend="sim"), backend="sim"
    )
    driver.run(planned, sweep_id=sweep_id)
    html = render(store, sweep_id)
    assert html.startswith("<!DOCTYPE html>") and html.count("<svg") == 2 + 2  # speedup, failures, 2 problems
    assert "failed trials by status" in html and "wrong_result" in html and "simulated wrong result" in html
    assert "m=8,k=64,n=64,g=4" in html and "tile=3" in html
    # Two problems: the speedup chart has one point per token bucket in each series.
    assert "vs xla k=64,n=64" in html and "vs heuristic k=64,n=64" in html
    assert "<script" not in html and not re.search(r"(src|href)=\"?https?:", html)


def test_nice_ticks_are_round_and_cover_the_range():
    from moetune.tuner.svg import nice_ticks

    assert nice_ticks(0, 2.26) == [0, 1, 2, 3]
    assert nice_ticks(0, 2) == [0, 0.5, 1, 1.5, 2]
    assert nice_ticks(0.3, 7.2) == [0, 2, 4, 6, 8]
    assert nice_ticks(1, 1) == [1]
