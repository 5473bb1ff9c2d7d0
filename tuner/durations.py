"""How the tuner's tables, reports and messages print a time: milliseconds to four significant digits."""

from __future__ import annotations


def ms(seconds: float | None) -> str:
    """0.00123 -> '1.23'; None (not measured) -> '-'."""
    return "-" if seconds is None else f"{seconds * 1e3:.4g}"
