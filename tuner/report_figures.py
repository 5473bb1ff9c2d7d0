"""The sweep report's charts, as Plotly figures (tuner/report.py places them in the page).

Times go on log axes: the XLA baseline is often 5-10x slower than every candidate, and on a linear axis
it squashes the candidates' differences into one pixel. Plotly reads a few HTML tags in any text it
draws (<b>, <br>, <a>), and config strings and error texts end up in labels, so every text given to a
figure goes through `escape` (Plotly shows the entities as the characters they stand for).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from html import escape

import plotly.graph_objects as go

COLOURS = {
    "winner": "#59a14f",
    "heuristic default": "#f28e2b",
    "xla ragged_dot": "#b07aa1",
    "other": "#4e79a7",
}
FAILED = "#e15759"
ROW_PX = 22  # height of one bar in the horizontal bar charts


@dataclasses.dataclass(frozen=True)
class Bar:
    label: str
    seconds: float
    role: str  # a key of COLOURS
    note: str = ""  # shown on hover


def _layout(figure: go.Figure, title: str, *, height: int) -> go.Figure:
    figure.update_layout(
        title={
            "text": escape(title),
            "x": 0.01,
            "xref": "container",
            "xanchor": "left",
            "font": {"size": 14},
        },
        # No Plotly template: applying one deep-copies it into every figure (most of a report's time).
        template="none",
        height=height,
        margin={"l": 10, "r": 40, "t": 70, "b": 50},
        legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1.0, "yanchor": "bottom"},
        font={"size": 11},
    )
    figure.update_xaxes(automargin=True)
    figure.update_yaxes(automargin=True)
    return figure


def time_per_config(bars: Sequence[Bar], title: str) -> go.Figure:
    """Horizontal bars in the order given (fastest first, on top), one legend entry per role."""
    figure = go.Figure()
    for role, colour in COLOURS.items():
        mine = [b for b in bars if b.role == role]
        if not mine:
            continue
        figure.add_trace(
            go.Bar(
                name=role,
                orientation="h",
                x=[b.seconds * 1e3 for b in mine],
                y=[escape(b.label) for b in mine],
                marker_color=colour,
                text=[escape(b.note) for b in mine],
                texttemplate="%{x:.4~g} ms",
                textposition="outside",
                hovertemplate="%{y}<br>%{x:.4~g} ms<br>%{text}<extra></extra>",
            )
        )
    figure.update_xaxes(type="log", title_text="median time (ms, log scale)")
    figure.update_yaxes(
        categoryorder="array",
        categoryarray=[escape(b.label) for b in bars],
        autorange="reversed",
        automargin=True,
    )
    return _layout(figure, title, height=120 + ROW_PX * len(bars))


def history(order: Sequence[int], seconds: Sequence[float | None], title: str) -> go.Figure:
    """Each trial's time and the best so far against the order in which the sweep recorded them; a failed
    trial takes its place in the order but has no point."""
    points = [(n, s) for n, s in zip(order, seconds, strict=True) if s is not None]
    best, lowest = [], float("inf")
    for _, s in points:
        lowest = min(lowest, s)
        best.append(lowest * 1e3)
    figure = go.Figure(
        [
            go.Scatter(
                name="trial",
                mode="markers",
                x=[n for n, _ in points],
                y=[s * 1e3 for _, s in points],
                marker={"color": COLOURS["other"], "size": 6},
                hovertemplate="trial %{x}: %{y:.4~g} ms<extra></extra>",
            ),
            go.Scatter(
                name="best so far",
                mode="lines",
                line={"shape": "hv", "color": COLOURS["winner"], "width": 2},
                x=[n for n, _ in points],
                y=best,
                hovertemplate="best after trial %{x}: %{y:.4~g} ms<extra></extra>",
            ),
        ]
    )
    figure.update_xaxes(title_text="trial (order recorded)")
    figure.update_yaxes(type="log", title_text="median time (ms, log scale)")
    return _layout(figure, title, height=340)


def importance(importances: Mapping[str, float], title: str) -> go.Figure:
    names = list(importances)
    figure = go.Figure(
        go.Bar(
            orientation="h",
            x=[importances[n] for n in names],
            y=[escape(n) for n in names],
            marker_color=COLOURS["other"],
            texttemplate="%{x:.2f}",
            textposition="outside",
            hovertemplate="%{y}: %{x:.3~f}<extra></extra>",
        )
    )
    figure.update_xaxes(title_text="importance (share of the total)", range=[0, 1.1])
    figure.update_yaxes(autorange="reversed", automargin=True)
    return _layout(figure, title, height=120 + ROW_PX * len(names))


def failures(counts: Mapping[str, int], title: str) -> go.Figure:
    statuses = list(counts)
    figure = go.Figure(
        go.Bar(
            x=[escape(s) for s in statuses],
            y=[counts[s] for s in statuses],
            marker_color=FAILED,
            texttemplate="%{y}",
            textposition="outside",
            hovertemplate="%{x}: %{y} trials<extra></extra>",
        )
    )
    figure.update_yaxes(title_text="trials")
    return _layout(figure, title, height=320)


@dataclasses.dataclass(frozen=True)
class Ratio:
    shape: str  # the series: problems that differ only in M
    m: int
    ratio: float
    note: str = ""


def ratio_by_bucket(ratios: Sequence[Ratio], title: str, axis_title: str) -> go.Figure:
    """Grouped bars of one ratio per token bucket (M), one colour per shape, with a line at 1x."""
    buckets = sorted({r.m for r in ratios})
    figure = go.Figure()
    for shape in dict.fromkeys(r.shape for r in ratios):
        mine = sorted((r for r in ratios if r.shape == shape), key=lambda r: r.m)
        figure.add_trace(
            go.Bar(
                name=escape(shape),
                x=[f"M={r.m}" for r in mine],
                y=[r.ratio for r in mine],
                text=[escape(r.note) for r in mine],
                texttemplate="%{y:.2f}x",
                textposition="outside",
                hovertemplate="%{x}: %{y:.3~f}x<br>%{text}<extra></extra>",
            )
        )
    figure.add_hline(y=1.0, line_dash="dash", line_color="#888")
    figure.update_xaxes(
        title_text="token bucket (M = tokens x top_k)",
        categoryorder="array",
        categoryarray=[f"M={m}" for m in buckets],
    )
    figure.update_yaxes(title_text=escape(axis_title), rangemode="tozero")
    figure.update_layout(barmode="group")
    return _layout(figure, title, height=380)


def _axis_values(values: Sequence[object]) -> tuple[list[float], list[float] | None, list[str] | None]:
    """Values as numbers for an axis: numbers as they are, anything else by its rank among the distinct
    values (with those as tick labels)."""
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return [float(v) for v in values], None, None  # type: ignore[arg-type]
    names = sorted({str(v) for v in values})
    rank = {name: i for i, name in enumerate(names)}
    return [float(rank[str(v)]) for v in values], [float(i) for i in range(len(names))], names


def slices(params: Mapping[str, Sequence[object]], seconds: Sequence[float], title: str) -> go.Figure:
    """One panel per parameter that varied: each ok trial's time against that parameter's value (as
    optuna-dashboard's slice plot), so a parameter whose value decides the time shows as a trend."""
    from plotly.subplots import make_subplots

    names = list(params)
    titles = [escape(n) for n in names]
    figure = make_subplots(rows=1, cols=len(names), shared_yaxes=True, subplot_titles=titles)
    for i, name in enumerate(names, 1):
        x, ticks, labels = _axis_values(params[name])
        figure.add_trace(
            go.Scatter(
                mode="markers",
                x=x,
                y=[s * 1e3 for s in seconds],
                marker={"color": COLOURS["other"], "size": 6, "opacity": 0.7},
                hovertemplate=f"{escape(name)}=%{{x}}: %{{y:.4~g}} ms<extra></extra>",
                showlegend=False,
            ),
            row=1,
            col=i,
        )
        if ticks is not None:
            figure.update_xaxes(tickvals=ticks, ticktext=[escape(t) for t in labels or ()], row=1, col=i)
    figure.update_yaxes(type="log")
    figure.update_yaxes(title_text="median time (ms, log scale)", row=1, col=1)
    return _layout(figure, title, height=320)


def parallel(params: Mapping[str, Sequence[object]], seconds: Sequence[float], title: str) -> go.Figure:
    """Every ok trial as a line through its parameters' values to its time (as optuna-dashboard's
    parallel coordinates), coloured by the time: the fast configs' shared values line up."""
    dimensions = []
    for name, values in params.items():
        x, ticks, labels = _axis_values(values)
        dimension: dict[str, object] = {"label": escape(name), "values": x}
        if ticks is not None:
            dimension |= {"tickvals": ticks, "ticktext": [escape(t) for t in labels or ()]}
        dimensions.append(dimension)
    times = [s * 1e3 for s in seconds]
    dimensions.append({"label": "median ms", "values": times})
    line = {"color": times, "colorscale": "Viridis", "reversescale": True, "showscale": True}
    figure = go.Figure(go.Parcoords(line=line, dimensions=dimensions))
    return _layout(figure, title, height=360)
