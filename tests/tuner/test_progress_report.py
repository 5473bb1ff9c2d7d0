"""What people see while a sweep runs: the live panel and the summary lines (the report: test_report.py)."""

from __future__ import annotations

import re

from rich.console import Console

from moetune.tuner.decided import RETIMED, Compared, Timed
from moetune.tuner.plan import parse_problem
from moetune.tuner.progress import LineProgress, RichProgress, Snapshot, summary_line
from moetune.tuner.summary import LiveRow

PROBLEM = parse_problem("m=128,k=64,n=64,g=4").problem
# One problem decided (its winner re-timed beside the heuristic), one still searching with nothing timed.
DECIDED = LiveRow(
    "mixtral gate_up T=64",
    "xla",
    PROBLEM,
    64,
    "decided",
    Timed(1.0e-3, RETIMED),
    Compared(Timed(1.5e-3, RETIMED), 1.5, RETIMED),
    {"strategy": "chunked"},
)
SEARCHING = LiveRow("mixtral down T=64", "xla", PROBLEM, 64, "searching", None, None, None)

SNAPSHOT = Snapshot(
    elapsed_s=60.0,
    recorded=10,
    planned=30,
    counts={"ok": 8, "crashed": 2},
    lanes={"node-a:gpu0": "mixtral gate_up T=64 tile=2", "node-a:gpu1": "idle"},
    best=[DECIDED, SEARCHING],
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
    assert re.search(
        r"mixtral gate_up T=64\s+│.*│\s+decided\s+│\s+1 re-timed\s+│\s+1.5 re-timed\s+│\s+1.50x", text
    )
    assert "winner / best ms" in text and "strategy=chunked" in text


def test_line_progress_prints_at_most_every_interval():
    console = Console(record=True, width=200)
    progress = LineProgress(console=console, every_s=3600)
    for _ in range(3):
        progress.update(SNAPSHOT)
    progress.close(SNAPSHOT)
    assert console.export_text().count("10/30 trials") == 2  # the first update and the close
