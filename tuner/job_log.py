"""A job's output, kept in the database while its worker runs it (moetune.db.progress): what the worker
writes to stderr during the job (the sweep's progress lines, warnings, errors) and its own events
(claimed, finished, failed), so the dashboard's job page shows them without access to the worker's
terminal.

Lines are gathered in memory and appended from a background thread every FLUSH_S, so a job's output
never waits on the database; a write that fails is retried with the next batch, and at most MAX_PENDING
lines wait (the oldest dropped beyond it, counted in one line). Terminal control sequences (colours, the
live panel's cursor moves) are removed; a carriage return ends a line as a newline does.
"""

from __future__ import annotations

import contextlib
import datetime
import re
import sys
import threading
from collections.abc import Iterator
from typing import Any, TextIO

from moetune.db.errors import DatabaseError

FLUSH_S = 2.0
MAX_PENDING = 2000
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


class JobLog:
    """Collects lines for one job and appends them to its log in the database."""

    def __init__(self, store: Any, job_id: int, *, flush_s: float = FLUSH_S) -> None:
        self.store, self.job_id, self.flush_s = store, job_id, flush_s
        self._pending: list[str] = []
        self._dropped = 0
        self._partial = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def line(self, text: str) -> None:
        """One event of the worker's, stamped with the time (UTC)."""
        self._add([f"{datetime.datetime.now(datetime.UTC):%H:%M:%S} {text}"])

    def write(self, text: str) -> None:
        """Output as a stream writes it: complete lines are kept, a partial one waits for its end."""
        with self._lock:
            text = self._partial + text.replace("\r\n", "\n").replace("\r", "\n")
            *complete, self._partial = text.split("\n")
        self._add([cleaned for line in complete if (cleaned := _CONTROL.sub("", line).rstrip())])

    def _add(self, lines: list[str]) -> None:
        if not lines:
            return
        with self._lock:
            self._pending.extend(lines)
            over = len(self._pending) - MAX_PENDING
            if over > 0:
                del self._pending[:over]
                self._dropped += over

    def flush(self) -> None:
        with self._lock:
            lines, self._pending = self._pending, []
            if self._dropped:
                lines.insert(0, f"... {self._dropped} lines dropped (the database did not take them in time)")
        if not lines:
            return
        try:
            self.store.append_job_log(self.job_id, lines)
            with self._lock:
                self._dropped = 0
        except DatabaseError:
            with self._lock:  # kept for the next try, in order
                self._pending[:0] = [line for line in lines if not line.startswith("... ")]

    def _loop(self) -> None:
        while not self._stop.wait(self.flush_s):
            self.flush()

    @contextlib.contextmanager
    def capturing(self) -> Iterator[JobLog]:
        """While the block runs, stderr also goes to this log, and a thread flushes every flush_s."""
        original = sys.stderr
        sys.stderr = _Tee(original, self)
        self._thread = threading.Thread(target=self._loop, name="moetune-job-log", daemon=True)
        self._thread.start()
        try:
            yield self
        finally:
            sys.stderr = original
            self._stop.set()
            self._thread.join(timeout=self.flush_s + 5)
            if self._partial.strip():
                self.write("\n")
            self.flush()


class _Tee:
    """A text stream that writes to `stream` and to `log`."""

    def __init__(self, stream: TextIO, log: JobLog) -> None:
        self._stream, self._log = stream, log

    def write(self, text: str) -> int:
        self._log.write(text)
        return self._stream.write(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def __getattr__(self, name: str) -> Any:  # fileno, encoding, ...: the stream's own
        return getattr(self._stream, name)
