"""What people see while a sweep runs: the live panel and the summary lines (the report: test_report.py)."""

from __future__ import annotations

import re

from rich.console import Console

from moetune.tuner.progress import LineProgress, RichProgress, Snapshot, summary_line

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
