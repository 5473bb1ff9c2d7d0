"""What people watch during a sweep: one lane per device (what it is timing), rate, ETA, and the best
config so far per problem. The driver hands a Snapshot to `update`; displays never reach back into it.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from moetune.tuner.durations import ms


@dataclasses.dataclass(frozen=True)
class Snapshot:
    elapsed_s: float
    recorded: int  # trials this session wrote
    planned: int  # trials this sweep will have written when done (an estimate while strategies run)
    counts: dict[str, int]  # this sweep's trials by status
    lanes: dict[str, str]  # device lane -> what it is timing ("idle")
    best: list[
        tuple[str, float | None, float | None, dict[str, Any] | None]
    ]  # label, best_s, heuristic_s, config
    workers: int = 1
    estimate_s: float | None = None  # seconds left, from the driver's ETA (tuner/eta.py)

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


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _config(config: dict[str, Any] | None) -> str:
    return "" if config is None else ",".join(f"{k}={v}" for k, v in config.items())


def summary_line(s: Snapshot) -> str:
    statuses = " ".join(f"{k}={v}" for k, v in sorted(s.counts.items())) or "no trials yet"
    return (
        f"{s.done}/{s.planned} trials ({statuses}), {s.rate_per_min:.1f}/min on {s.workers} workers, "
        f"elapsed {_duration(s.elapsed_s)}, ETA {_duration(s.eta_s)}"
    )


class Progress:
    """No display: the base for tests and scripts, and the contract (start, update*, close)."""

    def start(self, snapshot: Snapshot) -> None:
        pass

    def update(self, snapshot: Snapshot) -> None:
        pass

    def close(self, snapshot: Snapshot) -> None:
        pass


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
        self._live = Live(self._render(snapshot), console=self.console, refresh_per_second=4, transient=False)
        self._live.start()

    def update(self, snapshot: Snapshot) -> None:
        if self._live is not None:
            self._live.update(self._render(snapshot))

    def close(self, snapshot: Snapshot) -> None:
        if self._live is not None:
            self._live.update(self._render(snapshot))
            self._live.stop()
            self._live = None

    def _render(self, s: Snapshot) -> Group:
        lanes = Table(title="devices (one timing at a time each)", title_justify="left", expand=False)
        lanes.add_column("lane")
        lanes.add_column("timing")
        for lane, doing in s.lanes.items():
            lanes.add_row(lane, doing)
        best = Table(title="best so far", title_justify="left")
        for column in ("problem", "best ms", "heuristic ms", "speedup", "config"):
            best.add_column(column)
        for label, best_s, heuristic_s, config in s.best[: self.max_problems]:
            speedup = f"{heuristic_s / best_s:.2f}x" if best_s and heuristic_s else "-"
            best.add_row(label, ms(best_s), ms(heuristic_s), speedup, _config(config))
        if len(s.best) > self.max_problems:
            best.caption = f"... and {len(s.best) - self.max_problems} more problems"
        return Group(summary_line(s), lanes, best)


def default_progress() -> Progress:
    """The live panel on an interactive terminal, periodic lines otherwise."""
    return RichProgress() if sys.stderr.isatty() else LineProgress()
