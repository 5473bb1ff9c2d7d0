"""`moetune report SWEEP`: one self-contained HTML file (inline SVG, no scripts) about a sweep.

Sections: the sweep's settings and device; a table per problem (winner vs heuristic default vs XLA's
ragged_dot); speedup per token bucket; failures by status and reason; time per config per problem.
Everything comes from the database, so a report can be written anywhere, any time after the sweep.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
from html import escape
from typing import Any

from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.problem import Problem
from moetune.tuner import svg
from moetune.tuner.durations import ms
from moetune.tuner.tasks import OK, canonical
from moetune.tuner.warm_start import BASELINE_BACKEND, baseline_config

MAX_BARS = 30
COLOURS = {"winner": "#59a14f", "heuristic": "#f28e2b", "baseline": "#b07aa1", "other": "#4e79a7"}


@dataclasses.dataclass
class _ProblemData:
    problem: Problem
    label: str
    trials: list[Any] = dataclasses.field(default_factory=list)  # the sweep backend's trials
    baseline_s: float | None = None
    heuristic: dict[str, Any] | None = None
    winner: Any = None

    def ok(self) -> list[Any]:
        return sorted((t for t in self.trials if t.status == OK and t.median_s), key=lambda t: t.median_s)

    def median_of(self, config: dict[str, Any] | None) -> float | None:
        if config is None:
            return None
        key = canonical(config)
        return next((t.median_s for t in self.ok() if canonical(t.config) == key), None)

    @property
    def best_s(self) -> float | None:
        if self.winner is not None and self.winner.median_s:
            return self.winner.median_s
        ok = self.ok()
        return ok[0].median_s if ok else None


def _labels(spec: dict[str, Any]) -> dict[str, str]:
    labels = {}
    for item in spec.get("problems", []):
        try:
            labels[Problem.from_dict(item["problem"]).key] = item["label"]
        except (KeyError, TypeError, ValueError):
            continue
    return labels


def _heuristic(backend: str, problem: Problem, device: DeviceFingerprint | None) -> dict[str, Any] | None:
    """The backend's default for the problem, when the backend can be loaded here (best effort)."""
    if device is None:
        return None
    from moetune.kernels import registry
    from moetune.kernels.errors import MoetuneError

    try:
        return registry.get(backend).heuristic(problem, device).to_dict()
    except (MoetuneError, ImportError):
        return None


def collect(store: Any, sweep_id: int) -> tuple[Any, list[_ProblemData], list[Any]]:
    sweep = store.get_sweep(sweep_id)
    trials = store.trials(sweep_id=sweep_id)
    labels = _labels(sweep.spec)
    device = None
    if isinstance(sweep.spec.get("device"), dict):
        device = DeviceFingerprint.from_dict(sweep.spec["device"])
    problems: dict[str, _ProblemData] = {}
    baseline_key = canonical(baseline_config())
    for t in sorted(trials, key=lambda t: t.id):
        data = problems.get(t.problem.key)
        if data is None:
            short = f"m={t.problem.m},k={t.problem.k},n={t.problem.n},g={t.problem.g}"
            data = problems[t.problem.key] = _ProblemData(t.problem, labels.get(t.problem.key, short))
        if t.backend == sweep.backend:
            data.trials.append(t)
        if t.backend == BASELINE_BACKEND and canonical(t.config) == baseline_key and t.status == OK:
            data.baseline_s = t.median_s
    for data in problems.values():
        data.heuristic = _heuristic(sweep.backend, data.problem, device)
        if data.trials:
            data.winner = store.current_winner(
                fingerprint_hash=data.trials[0].fingerprint_hash,
                backend=sweep.backend,
                problem_key=data.problem.key,
            )
    ordered = sorted(problems.values(), key=lambda d: (d.problem.shape_key, d.problem.m))
    return sweep, ordered, trials


def _ratio(slow: float | None, fast: float | None) -> str:
    return f"{slow / fast:.2f}x" if slow and fast else "-"


def _config(config: dict[str, Any] | None) -> str:
    return "" if not config else ", ".join(f"{k}={v}" for k, v in config.items())


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _summary(problems: list[_ProblemData]) -> str:
    rows = []
    for d in problems:
        heuristic_s = d.median_of(d.heuristic)
        failed = sum(1 for t in d.trials if t.status != OK)
        rows.append(
            [
                d.label,
                f"{len(d.trials) - failed} ok, {failed} failed",
                ms(d.best_s),
                ms(heuristic_s),
                ms(d.baseline_s),
                _ratio(heuristic_s, d.best_s),
                _ratio(d.baseline_s, d.best_s),
                _config(d.winner.config if d.winner else None),
            ]
        )
    header = ["problem", "trials", "winner ms", "heuristic ms", "xla ms", "vs heuristic", "vs xla", "winner"]
    return _table(header, rows)


def _speedup_chart(problems: list[_ProblemData]) -> str:
    series: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    for d in problems:
        shape = f"k={d.problem.k},n={d.problem.n}"
        heuristic_s = d.median_of(d.heuristic)
        if d.best_s and d.baseline_s:
            series[f"vs xla {shape}"].append((d.problem.m, d.baseline_s / d.best_s))
        if d.best_s and heuristic_s:
            series[f"vs heuristic {shape}"].append((d.problem.m, heuristic_s / d.best_s))
    return svg.line_chart(
        dict(series),
        title="speedup of the winner per token bucket",
        x_label="M (token rows = tokens x top_k)",
        y_label="speedup (x)",
        reference=1.0,
    )


def _failures(trials: list[Any]) -> str:
    by_status = collections.Counter(t.status for t in trials if t.status != OK)
    if not by_status:
        return "<p>No candidate failed.</p>"
    chart = svg.bar_chart(
        [(status, count, "#e15759") for status, count in by_status.most_common()],
        title="failed trials by status",
        unit="trials",
    )
    reasons = collections.Counter(
        (t.status, (t.error.splitlines() or [""])[0][:160]) for t in trials if t.status != OK
    )
    rows = [[status, reason, str(count)] for (status, reason), count in reasons.most_common(40)]
    return chart + _table(["status", "reason", "trials"], rows)


def _per_config(d: _ProblemData) -> str:
    ok = d.ok()
    winner_key = canonical(d.winner.config) if d.winner else None
    heuristic_key = canonical(d.heuristic) if d.heuristic else None
    bars = []
    for t in ok[:MAX_BARS]:
        key = canonical(t.config)
        role = "winner" if key == winner_key else "heuristic" if key == heuristic_key else "other"
        bars.append((_config(t.config), t.median_s * 1e3, COLOURS[role]))
    if d.baseline_s:
        bars.append(("xla ragged_dot (baseline)", d.baseline_s * 1e3, COLOURS["baseline"]))
    more = f" (fastest {MAX_BARS} of {len(ok)})" if len(ok) > MAX_BARS else ""
    legend = "green: the winner (decided by interleaved re-timing), orange: heuristic default, purple: XLA"
    chart = svg.bar_chart(bars, title=f"{d.label}: median time per config{more}", unit="ms", legend=legend)
    return f"<details><summary>{escape(d.label)}</summary>{chart}</details>"


STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; }
th { background: #f3f3f3; }
details { margin: 0.4em 0; }
"""


def render(store: Any, sweep_id: int) -> str:
    sweep, problems, trials = collect(store, sweep_id)
    device = sweep.spec.get("device", {})
    settings = sweep.spec.get("spec", {})
    facts = [
        ["backend", sweep.backend],
        ["strategy", sweep.strategy],
        ["status", sweep.status],
        ["device", str(device.get("device_kind", "?"))],
        ["host / user", f"{sweep.host} / {sweep.user}"],
        ["started / finished", f"{sweep.created_at} / {sweep.finished_at or '-'}"],
        ["trials", str(len(trials))],
    ] + [[k, str(v)] for k, v in sorted(settings.items()) if v not in (None, [], "")]
    per_config = "".join(_per_config(d) for d in problems if d.trials)
    generated = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>moetune sweep {sweep_id}</title><style>{STYLE}</style></head>
<body>
<h1>moetune sweep {sweep_id}</h1>
{_table(["setting", "value"], facts)}
<h2>Winners</h2>
{_summary(problems)}
<h2>Speedup per token bucket</h2>
{_speedup_chart(problems)}
<h2>Failures</h2>
{_failures(trials)}
<h2>Time per config</h2>
{per_config or "<p>No candidate passed.</p>"}
<p style="color:#888">generated {generated} by moetune</p>
</body></html>
"""
