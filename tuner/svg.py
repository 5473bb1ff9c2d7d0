"""Two small inline-SVG charts for the sweep report (horizontal bars, lines over a log2 x axis).

Inline SVG keeps the report one self-contained file with no plotting dependency; every label is
escaped, since config strings and error texts end up in it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f")
FONT = 'font-family="sans-serif" font-size="11"'


def _svg(width: int, height: int, body: list[str], title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img"><title>{escape(title)}</title>'
        f'<text x="{width / 2}" y="16" text-anchor="middle" {FONT} font-weight="bold">{escape(title)}</text>'
        + "".join(body)
        + "</svg>"
    )


def bar_chart(bars: Sequence[tuple[str, float, str]], *, title: str, unit: str, legend: str = "") -> str:
    """Horizontal bars: (label, value, colour) in the order given; values must be >= 0."""
    row = 18
    # Sans-serif at 11px averages under 7px a character: room for the longest label.
    label_width = min(600, max(120, 7 * max((len(label) for label, _, _ in bars), default=0) + 12))
    span = 360
    width = max(label_width + span + 100, 7 * len(legend) + 20)
    height = 40 + row * max(1, len(bars)) + (30 if legend else 10)
    top = max((value for _, value, _ in bars), default=0.0) or 1.0
    body = []
    for i, (label, value, colour) in enumerate(bars):
        y = 30 + i * row
        length = span * value / top
        body.append(
            f'<text x="{label_width - 6}" y="{y + 12}" text-anchor="end" {FONT}>{escape(label)}</text>'
            f'<rect x="{label_width}" y="{y + 2}" width="{length:.1f}" height="{row - 5}" fill="{colour}"/>'
            f'<text x="{label_width + length + 4:.1f}" y="{y + 12}" {FONT}>{value:.4g} {escape(unit)}</text>'
        )
    if legend:
        body.append(f'<text x="10" y="{height - 10}" {FONT} fill="#555">{escape(legend)}</text>')
    return _svg(width, height, body, title)


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About `count` round tick values (1, 2 or 5 times a power of ten apart) covering [low, high]."""
    if high <= low:
        return [low]
    raw = (high - low) / max(1, count - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(low / step) * step
    return [first + i * step for i in range(int(math.ceil((high - first) / step)) + 1)]


def line_chart(
    series: dict[str, Sequence[tuple[float, float]]],
    *,
    title: str,
    x_label: str,
    y_label: str,
    width: int = 760,
    plot_height: int = 260,
    reference: float | None = None,
) -> str:
    """Lines over a log2 x axis (token counts), legend below; `reference` draws a dashed level (e.g. 1x)."""
    points = [p for values in series.values() for p in values if p[0] > 0]
    if not points:
        return _svg(width, 60, [f'<text x="10" y="40" {FONT}>no data</text>'], title)
    left, right, top = 60, 30, 30
    xs = [math.log2(x) for x, _ in points]
    ys = [y for _, y in points] + ([reference] if reference is not None else [])
    x_lo, x_hi = min(xs), max(xs)
    ticks = nice_ticks(min(0.0, min(ys)), max(ys))
    y_lo, y_hi = ticks[0], ticks[-1]
    plot_w, plot_h = width - left - right, plot_height
    height = top + plot_h + 44 + 16 * len(series)

    def px(x: float) -> float:
        return left + (math.log2(x) - x_lo) / ((x_hi - x_lo) or 1) * plot_w

    def py(y: float) -> float:
        return top + plot_h - (y - y_lo) / ((y_hi - y_lo) or 1) * plot_h

    body = [
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#333"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#333"/>',
        f'<text x="{left + plot_w / 2}" y="{top + plot_h + 32}" text-anchor="middle" {FONT}>'
        f"{escape(x_label)}</text>",
        f'<text x="14" y="{top + plot_h / 2}" text-anchor="middle" {FONT} '
        f'transform="rotate(-90 14 {top + plot_h / 2})">{escape(y_label)}</text>',
    ]
    for x in sorted({x for x, _ in points}):
        body.append(f'<text x="{px(x):.1f}" y="{top + plot_h + 14}" text-anchor="middle" {FONT}>{x:g}</text>')
    for y in ticks:
        body.append(f'<text x="{left - 4}" y="{py(y) + 4:.1f}" text-anchor="end" {FONT}>{y:g}</text>')
    if reference is not None:
        body.append(
            f'<line x1="{left}" y1="{py(reference):.1f}" x2="{left + plot_w}" y2="{py(reference):.1f}" '
            'stroke="#999" stroke-dasharray="4 3"/>'
        )
    for i, (name, values) in enumerate(series.items()):
        colour = PALETTE[i % len(PALETTE)]
        ordered = sorted(p for p in values if p[0] > 0)
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in ordered)
        body.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        body += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}"/>' for x, y in ordered]
        legend_y = top + plot_h + 44 + 16 * i
        body.append(
            f'<rect x="{left}" y="{legend_y - 9}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{left + 16}" y="{legend_y}" {FONT}>{escape(name)}</text>'
        )
    return _svg(width, height, body, title)
