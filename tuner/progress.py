"""What people watch during a sweep: one lane per device (what it is timing) and the workers' set-up
(starting, preparing a problem's inputs and references), rate, ETA, each problem's trials and phase,
and each problem's winner as decided (else its best so far). The driver hands a Snapshot to `update`;
displays never reach back into it. Before the driver runs, the set-up (cluster and workers starting) is
shown with `setup_snapshot`.
"""

from __future__ import annotations

import dataclasses
import sys
import time

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from moetune.tuner import executors
from moetune.tuner.executors import WorkerActivity
from moetune.tuner.summary import LiveRow, live_cells

# A problem's phase, as ProblemProgress.phase says it.
WAITING = "waiting"
COMPILING = "compiling"
TIMING = "timing"
RETIMING = "re-timing finalists"
DONE = "done"
SKIPPED = "skipped"
RUNNING = "running"  # in flight on an executor that does not say which step


@dataclasses.dataclass(frozen=True)
class ProblemProgress:
    label: str
    done: int  # trials this sweep recorded for it
    planned: int  # trials it will have when done: its budget, or about its untried configs
    phase: str


@dataclasses.dataclass(frozen=True)
class Snapshot:
    elapsed_s: float
    recorded: int  # trials this session wrote
    planned: int  # trials this sweep will have written when done (an estimate while strategies run)
    counts: dict[str, int]  # this sweep's trials by status
    lanes: dict[str, str]  # device lane -> what it is timing ("idle")
    best: list[LiveRow]  # per problem: the winner as decided, or the best so far (tuner/summary.py)
    workers: int = 1
    estimate_s: float | None = None  # seconds left, from the driver's ETA (tuner/eta.py)
    problems: list[ProblemProgress] = dataclasses.field(default_factory=list)
    setup: dict[str, str] = dataclasses.field(default_factory=dict)  # worker -> what it sets up now
    stage: str = ""  # before the sweep's loop runs: what is being set up

    @property
    def rate_per_min(self) -> float:
        return self.recorded / self.elapsed_s * 60 if self.elapsed_s > 0 else 0.0

    @property
    def done(self) -> int:
        return sum(self.counts.values())

    @property
    def eta_s(self) -> float | None:
        """The driver's estimate; without one (a snapshot built by hand), trials left at this session's
        rate."""
        if self.estimate_s is not None:
            return self.estimate_s
        left = max(0, self.planned - self.done)
        return left / (self.recorded / self.elapsed_s) if self.recorded and self.elapsed_s > 0 else None


def duration(seconds: float | None) -> str:
    """Seconds as m:ss or h:mm:ss ("?" when unknown), as the progress line and the live pages show them."""
    if seconds is None:
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def setup_rows(activity: list[WorkerActivity]) -> dict[str, str]:
    """The workers setting up, and what they do: starting, or making a problem's inputs and references."""
    rows = {}
    for a in activity:
        if a.state == executors.STARTING:
            rows[a.worker] = "starting: importing JAX, opening the device"
        elif a.state == executors.PREPARING:
            rows[a.worker] = f"preparing inputs and references, compiling: {a.label}"
    return rows


def setup_snapshot(stage: str, elapsed_s: float, activity: list[WorkerActivity] | None = None) -> Snapshot:
    """What the display shows before the sweep's loop: the stage, and the workers starting."""
    workers = len(activity) if activity else 1
    return Snapshot(
        elapsed_s, 0, 0, {}, {}, [], workers=workers, setup=setup_rows(activity or []), stage=stage
    )


def problem_phase(phase: str, in_flight: list[str], activity: dict[str, str]) -> str:
    """A problem's phase for people from its run's phase (tuner/problem_run.py), the ids of its tasks in
    flight and what the executor says each task does (task id -> WorkerActivity.state)."""
    if phase == "skipped":
        return SKIPPED
    if phase in ("settled", "done"):
        return DONE
    if phase in ("retime_wanted", "retime"):
        return RETIMING
    if not in_flight:
        return WAITING
    states = {activity.get(task_id) for task_id in in_flight}
    if executors.TIMING in states:
        return TIMING
    if states & {executors.PREPARING, executors.COMPILING, executors.WAITING}:
        return COMPILING
    return RUNNING


def summary_line(s: Snapshot) -> str:
    if s.stage:
        doing = "; ".join(f"{worker} {what}" for worker, what in s.setup.items())
        return f"set-up: {s.stage}, elapsed {duration(s.elapsed_s)}" + (f" ({doing})" if doing else "")
    statuses = " ".join(f"{k}={v}" for k, v in sorted(s.counts.items())) or "no trials yet"
    return (
        f"{s.done}/{s.planned} trials ({statuses}), {s.rate_per_min:.1f}/min on {s.workers} workers, "
        f"elapsed {duration(s.elapsed_s)}, ETA {duration(s.eta_s)}"
    )


class Progress:
    """No display: the base for tests and scripts, and the contract (start, update*, close)."""

    def start(self, snapshot: Snapshot) -> None:
        pass

    def update(self, snapshot: Snapshot) -> None:
        pass

    def close(self, snapshot: Snapshot) -> None:
        pass

    def abandon(self) -> None:
        """Stop showing, printing nothing more: the set-up failed before a sweep ran (its error says why)."""


NullProgress = Progress


class LineProgress(Progress):
    """One summary line every `every_s` seconds: for logs and terminals that are not interactive."""

    def __init__(self, console: Console | None = None, every_s: float = 10.0) -> None:
        self.console = console or Console(stderr=True)
        self.every_s = every_s
        self._last = -float("inf")

    def update(self, snapshot: Snapshot) -> None:
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            self.console.print(summary_line(snapshot), markup=False, highlight=False)

    def close(self, snapshot: Snapshot) -> None:
        self.console.print(summary_line(snapshot), markup=False, highlight=False)


class RichProgress(Progress):
    """A live panel: the summary line, one row per device lane, best-so-far per problem."""

    def __init__(self, console: Console | None = None, max_problems: int = 40) -> None:
        self.console = console or Console(stderr=True)
        self.max_problems = max_problems
        self._live: Live | None = None

    def start(self, snapshot: Snapshot) -> None:
        if self._live is not None:  # the set-up's display, continued by the sweep's
            self.update(snapshot)
            return
        self._live = Live(self._render(snapshot), console=self.console, refresh_per_second=4, transient=False)
        self._live.start()

    def update(self, snapshot: Snapshot) -> None:
        if self._live is not None:
            self._live.update(self._render(snapshot))

    def close(self, snapshot: Snapshot) -> None:
        if self._live is not None:
            self._live.update(self._render(snapshot))
        self.abandon()

    def abandon(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _render(self, s: Snapshot) -> Group:
        lanes = Table(title="devices (one timing at a time each)", title_justify="left", expand=False)
        lanes.add_column("lane")
        lanes.add_column("timing")
        for lane, doing in s.lanes.items():
            lanes.add_row(lane, doing)
        for worker, doing in s.setup.items():
            lanes.add_row(f"{worker} (set-up)", doing)
        if s.stage:
            return Group(summary_line(s), lanes)
        problems = Table(title="problems", title_justify="left")
        for column in ("problem", "trials", "phase"):
            problems.add_column(column)
        for p in s.problems[: self.max_problems]:
            problems.add_row(p.label, f"{p.done}/{p.planned}", p.phase)
        best = Table(title="winners as decided (re-timed), else the best so far", title_justify="left")
        cells = live_cells(s.best[: self.max_problems])
        for column in cells[0] if cells else ():
            best.add_column(column)
        for row in cells:  # labels come from model files: cells, never markup
            best.add_row(*map(Text, row.values()))
        if len(s.best) > self.max_problems:
            best.caption = f"... and {len(s.best) - self.max_problems} more problems"
        return Group(summary_line(s), lanes, problems, best)


def default_progress() -> Progress:
    """The live panel on an interactive terminal, periodic lines otherwise."""
    return RichProgress() if sys.stderr.isatty() else LineProgress()
