"""How the tuner's tables, reports and messages print a time: one unit per table, named in its header.

The rule, the same for every table: milliseconds, unless every time in the table is below 0.1 ms, then
microseconds (a decode-sized GEMM reads 20.1 us rather than 0.0201 ms). Four significant digits; "-"
for a time not measured. A single time in a sentence is in milliseconds (`ms`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

TINY_S = 1e-4  # below this everywhere in a table, the table is in microseconds


@dataclasses.dataclass(frozen=True)
class Unit:
    name: str  # what a header says: "ms" or "us"
    per_second: float

    def format(self, seconds: float | None) -> str:
        """0.00123 s in ms -> '1.23'; None (not measured) -> '-'."""
        return "-" if seconds is None else f"{seconds * self.per_second:.4g}"


MS = Unit("ms", 1e3)
US = Unit("us", 1e6)


def unit_for(seconds: Iterable[float | None]) -> Unit:
    """The unit of a table holding these times (None: not measured, ignored)."""
    known = [s for s in seconds if s is not None]
    return US if known and max(known) < TINY_S else MS


def ms(seconds: float | None) -> str:
    """0.00123 -> '1.23'; None (not measured) -> '-'."""
    return MS.format(seconds)
