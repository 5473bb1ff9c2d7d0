"""`moetune report SWEEP`: one self-contained HTML file about a sweep, with Plotly charts.

plotly.js is embedded inline (about 5 MB), so the page renders offline and loads nothing from elsewhere.
Sections: the sweep's settings and device; the winners (winner vs heuristic default vs XLA's ragged_dot,
and the decision that promoted each winner); winner vs heuristic and winner vs XLA per token bucket, one
ratio per chart; failures by status and reason; per problem, time per config, the optimisation history,
parameter importance, slices and parallel coordinates (as optuna-dashboard draws them) and the failed
trials. Everything comes from the database, so a report can be
written anywhere, any time after the sweep. The service's sweep page shows the same sections
(`sections`), around which it puts its own page.

A winner is shown with the interleaved re-timed median that decided it and the decision (rule, rounds,
gain) stored with it, beside its own sweep median; the heuristic and XLA are compared on re-timed medians
where they were finalists, else on sweep medians of both, and each number says which it is
(tuner/decided.py). A winner without a stored decision shows its recorded median, labelled so; where
single medians then rank the heuristic ahead of it, the page says so beside the reason it was promoted.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
from html import escape
from typing import Any

from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.problem import Problem
from moetune.tuner import config_diff, decided, optuna_study
from moetune.tuner import report_figures as figures
from moetune.tuner.decided import Compared, WinnerView
from moetune.tuner.durations import ms, unit_for
from moetune.tuner.tasks import OK, canonical
from moetune.tuner.warm_start import BASELINE_BACKEND, baseline_config

MAX_BARS = 40  # configs per time chart: the fastest, plus the winner and the heuristic wherever they rank
MAX_FAILED_ROWS = 50


@dataclasses.dataclass
class _ProblemData:
    problem: Problem
    label: str
    tokens: int | None = None
    trials: list[Any] = dataclasses.field(default_factory=list)  # the sweep backend's trials
    baseline_s: float | None = None
    baseline: dict[str, Any] | None = None  # the baseline's config when the sweep's backend is xla
    heuristic: dict[str, Any] | None = None
    winner: Any = None
    study: optuna_study.ProblemStudy | None = None

    @property
    def view(self) -> WinnerView | None:
        w = self.winner
        return None if w is None else WinnerView.of(w.trial_id, w.config, w.median_s, [w.decision])

    @property
    def vs_heuristic(self) -> Compared | None:
        view = self.view
        return view.versus(self.heuristic, self.median_of(self.heuristic)) if view else None

    @property
    def vs_baseline(self) -> Compared | None:
        view = self.view
        return view.versus(self.baseline, self.baseline_s) if view else None

    def ok(self) -> list[Any]:
        return sorted((t for t in self.trials if t.status == OK and t.median_s), key=lambda t: t.median_s)

    def failed(self) -> list[Any]:
        return [t for t in self.trials if t.status != OK]

    def median_of(self, config: dict[str, Any] | None) -> float | None:
        if config is None:
            return None
        key = canonical(config)
        return next((t.median_s for t in self.ok() if canonical(t.config) == key), None)

    @property
    def best_s(self) -> float | None:
        """The winner's time as decided, else the fastest sweep median."""
        if self.view is not None and self.view.time.seconds:
            return self.view.time.seconds
        ok = self.ok()
        return ok[0].median_s if ok else None

    @property
    def shape(self) -> str:
        p = self.problem
        return f"{p.op} k={p.k},n={p.n},g={p.g}"


def _planned(spec: dict[str, Any]) -> dict[str, Any]:
    """The sweep's planned problems (label, tokens) by problem key."""
    from moetune.tuner.plan import PlannedProblem

    planned = {}
    for item in spec.get("problems", []):
        try:
            p = PlannedProblem.from_dict(item)
        except (KeyError, TypeError, ValueError):
            continue
        planned[p.problem.key] = p
    return planned


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


def collect(store: Any, sweep_id: int, *, studies: bool = True) -> tuple[Any, list[_ProblemData], list[Any]]:
    """The sweep, its problems' data and its trials; `studies`: also the Optuna study per problem (for
    parameter importance; the winners' comparisons alone do without it)."""
    sweep = store.get_sweep(sweep_id)
    trials = store.trials(sweep_id=sweep_id)
    planned = _planned(sweep.spec)
    device = optuna_study.sweep_device(sweep.spec)
    narrowed = (sweep.spec.get("spec") or {}).get("space")
    problems: dict[str, _ProblemData] = {}
    baseline_key = canonical(baseline_config())
    for t in sorted(trials, key=lambda t: t.id):
        data = problems.get(t.problem.key)
        if data is None:
            short = f"m={t.problem.m},k={t.problem.k},n={t.problem.n},g={t.problem.g}"
            known = planned.get(t.problem.key)
            label, tokens = (known.label, known.tokens) if known else (short, None)
            data = problems[t.problem.key] = _ProblemData(t.problem, label, tokens)
        if t.backend == sweep.backend:
            data.trials.append(t)
        if t.backend == BASELINE_BACKEND and canonical(t.config) == baseline_key and t.status == OK:
            data.baseline_s = t.median_s
    for data in problems.values():
        data.heuristic = _heuristic(sweep.backend, data.problem, device)
        data.baseline = baseline_config() if sweep.backend == BASELINE_BACKEND else None
        if data.trials:
            data.winner = store.current_winner(
                fingerprint_hash=data.trials[0].fingerprint_hash,
                backend=sweep.backend,
                problem_key=data.problem.key,
            )
            if studies:
                data.study = optuna_study.problem_study(
                    sweep.backend, data.problem, device, narrowed, data.trials, sweep.created_at
                )
    ordered = sorted(problems.values(), key=lambda d: (d.problem.shape_key, d.problem.m))
    return sweep, ordered, trials


def _config(config: dict[str, Any] | None) -> str:
    return "" if not config else ", ".join(f"{k}={v}" for k, v in config.items())


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _reason(error: str) -> str:
    return (error.splitlines() or [""])[0][:160]


class _Plots:
    """The page's figures in page order; each becomes one Plotly div (ids unique within the page)."""

    def __init__(self) -> None:
        self.figures: list[Any] = []

    def html(self, figure: Any) -> str:
        import plotly.io

        self.figures.append(figure)
        config = {"displaylogo": False, "responsive": True}
        div_id = f"plot-{len(self.figures)}"
        return plotly.io.to_html(
            figure, full_html=False, include_plotlyjs=False, div_id=div_id, config=config
        )


def _decision(d: _ProblemData) -> str:
    """Why the winner is the winner: the rule that decided it (with its rounds and gain) and the
    promotion's own words; for a winner without a stored decision, a warning where the sweep's single
    medians rank the heuristic default ahead of it."""
    view = d.view
    if view is None:
        return "no winner"
    note = d.winner.reason or "promoted without a recorded reason"
    if view.decision is not None:
        return f"{decided.describe(view.decision)}: {note}"
    versus = d.vs_heuristic
    if versus is not None and versus.ratio is not None and versus.ratio < 1:
        note = (
            f"no decision kept; single medians: heuristic {ms(versus.time.seconds)} ms < winner "
            f"{ms(view.sweep_s)} ms; promoted: {note}"
        )
    return note


def _timed(compared: Compared | None, unit: Any) -> str:
    return "-" if compared is None else compared.cell(unit)


def _times(compared: Compared | None) -> str:
    return "-" if compared is None else compared.ratio_cell()


def _summary(problems: list[_ProblemData], backend: str) -> str:
    views = [d.view for d in problems]
    times = [t for v in views if v for t in (v.time.seconds, v.sweep_s)]
    times += [c.time.seconds for d in problems for c in (d.vs_heuristic, d.vs_baseline) if c]
    unit = unit_for(times)
    with_tokens = any(d.tokens is not None for d in problems)
    rows = []
    for d, view in zip(problems, views, strict=True):
        failed = len(d.failed())
        winner = "-" if view is None else view.cell(unit)
        rows.append(
            [d.label, d.problem.op]
            + ([str(d.tokens) if d.tokens else "-"] if with_tokens else [])
            + [
                str(d.problem.m),
                f"{len(d.trials) - failed} ok, {failed} failed",
                winner,
                unit.format(view.sweep_s) if view else "-",
                _timed(d.vs_heuristic, unit),
                _timed(d.vs_baseline, unit),
                _times(d.vs_heuristic),
                _times(d.vs_baseline),
                config_diff.text(backend, d.winner.config if d.winner else None),
                _decision(d),
            ]
        )
    header = (
        ["problem", "op"]
        + (["T"] if with_tokens else [])
        + [
            "m",
            "trials",
            f"winner {unit.name}",
            f"its sweep {unit.name}",
            f"heuristic {unit.name}",
            f"xla {unit.name}",
            "heuristic / winner",
            "xla / winner",
            "winner config (not default)",
            "decided by",
        ]
    )
    note = (
        "<p class=note>winner: the median of the interleaved re-timing that decided it (or, without a "
        "stored decision, its recorded median); heuristic and xla: re-timed beside it where they were "
        "finalists, else their sweep medians, each ratio then against the winner's sweep median. T tokens, "
        "m = T x top_k rows"
        + ("" if with_tokens and all(d.tokens for d in problems) else "; T - unknown")
        + ".</p>"
    )
    return _table(header, rows) + note


def _speedups(problems: list[_ProblemData], plots: _Plots) -> str:
    """Two charts, one ratio each: the heuristic's time over the winner's, and XLA's over the winner's."""
    vs_heuristic, vs_xla = [], []
    for d in problems:
        heuristic, baseline = d.vs_heuristic, d.vs_baseline
        if heuristic is not None and heuristic.ratio:
            note = _decision(d) if heuristic.ratio < 1 else ""
            vs_heuristic.append(figures.Ratio(d.shape, d.problem.m, heuristic.ratio, note))
        if baseline is not None and baseline.ratio:
            vs_xla.append(figures.Ratio(d.shape, d.problem.m, baseline.ratio))
    parts = []
    for ratios, title, axis, missing in (
        (
            vs_heuristic,
            "winner vs the heuristic default: heuristic time / winner time",
            "heuristic / winner (x)",
            "No problem has both a winner and a timed heuristic default.",
        ),
        (
            vs_xla,
            "winner vs XLA's ragged_dot: XLA time / winner time",
            "xla / winner (x)",
            "No problem has both a winner and a timed XLA baseline.",
        ),
    ):
        parts.append(
            plots.html(figures.ratio_by_bucket(ratios, title, axis)) if ratios else f"<p>{missing}</p>"
        )
    return "".join(parts)


def _failures(trials: list[Any], plots: _Plots) -> str:
    by_status = collections.Counter(t.status for t in trials if t.status != OK)
    if not by_status:
        return "<p>No candidate failed.</p>"
    chart = plots.html(figures.failures(dict(by_status.most_common()), "failed trials by status"))
    reasons = collections.Counter((t.status, _reason(t.error)) for t in trials if t.status != OK)
    rows = [[status, reason, str(count)] for (status, reason), count in reasons.most_common(40)]
    return chart + _table(["status", "reason", "trials"], rows)


def _varying(configs: list[dict[str, Any]]) -> tuple[list[str], dict[str, Any]]:
    """The parameters whose values differ among `configs`, and the values all of them share."""
    names = list(dict.fromkeys(name for c in configs for name in c))
    varying = [n for n in names if len({repr(c.get(n)) for c in configs}) > 1]
    shared = {n: configs[0].get(n) for n in names if n not in varying}
    return varying, shared


def _time_per_config(d: _ProblemData, plots: _Plots) -> str:
    ok = d.ok()
    winner_key = canonical(d.winner.config) if d.winner else None
    heuristic_key = canonical(d.heuristic) if d.heuristic else None
    shown = ok[:MAX_BARS] + [t for t in ok[MAX_BARS:] if canonical(t.config) in (winner_key, heuristic_key)]
    roles = {winner_key: "winner", heuristic_key: "heuristic default"}
    # A sweep of the xla backend times the baseline config as one of its candidates: marked, not repeated.
    baseline_shown = ok[0].backend == BASELINE_BACKEND and any(
        canonical(t.config) == canonical(baseline_config()) for t in shown
    )
    if baseline_shown:
        roles = {canonical(baseline_config()): "xla ragged_dot"} | roles
    entries: list[tuple[dict[str, Any], figures.Bar]] = []  # (config, its bar before it has a label)
    for t in shown:
        role = roles.get(canonical(t.config), "other")
        note = f"trial {t.id} (sweep median); {_decision(d)}" if role == "winner" else f"trial {t.id}"
        entries.append((t.config, figures.Bar("", t.median_s, role, note)))
    if d.winner is not None and d.winner.median_s and all(bar.role != "winner" for _, bar in entries):
        # The winner was timed outside this sweep (kept from an earlier one): still shown, saying so.
        note = f"trial {d.winner.trial_id}, timed outside this sweep; {_decision(d)}"
        entries.append((d.winner.config, figures.Bar("", d.winner.median_s, "winner", note)))
    varying, shared = _varying([config for config, _ in entries])
    bars = [
        dataclasses.replace(bar, label=_config({n: config.get(n) for n in varying}) or _config(config))
        for config, bar in entries
    ]
    if d.baseline_s and not baseline_shown:
        bars.append(figures.Bar("xla ragged_dot (baseline)", d.baseline_s, "xla ragged_dot"))
    bars.sort(key=lambda b: b.seconds)
    bars = [dataclasses.replace(b, label=f"#{i} {b.label}") for i, b in enumerate(bars, 1)]
    more = f" (the fastest {MAX_BARS} of {len(ok)})" if len(ok) > MAX_BARS else ""
    chart = plots.html(figures.time_per_config(bars, f"{d.label}: median time per config{more}"))
    common = (
        f"<p class=note>Every config shown has {escape(_config(shared))}.</p>" if shared and varying else ""
    )
    return chart + common


def _history(d: _ProblemData, plots: _Plots) -> str:
    order = list(range(1, len(d.trials) + 1))
    seconds = [t.median_s if t.status == OK and t.median_s else None for t in d.trials]
    return plots.html(figures.history(order, seconds, f"{d.label}: optimisation history"))


def _importance(d: _ProblemData, plots: _Plots) -> str:
    importances = optuna_study.importances(d.study) if d.study is not None else None
    if importances is None:
        return (
            f"<p>Parameter importance: not enough trials ({len(d.ok())} ok; Optuna's evaluator needs at "
            f"least {optuna_study.MIN_IMPORTANCE_TRIALS}, and a parameter that took two values).</p>"
        )
    title = f"{d.label}: parameter importance (Optuna, {len(d.ok())} ok trials)"
    return plots.html(figures.importance(importances, title))


def _slices(d: _ProblemData, plots: _Plots) -> str:
    """The slice and parallel-coordinate views of the ok trials over the parameters that varied, as
    optuna-dashboard draws them; nothing with fewer than three ok trials or no varying parameter."""
    ok = d.ok()
    varying, _ = _varying([t.config for t in ok])
    if len(ok) < MIN_SLICE_TRIALS or not varying:
        return ""
    params = {name: [t.config.get(name) for t in ok] for name in varying}
    seconds = [t.median_s for t in ok]
    slices = figures.slices(params, seconds, f"{d.label}: time by parameter value")
    lines = figures.parallel(params, seconds, f"{d.label}: parameters of every ok trial")
    return plots.html(slices) + plots.html(lines)


def _failed_trials(d: _ProblemData) -> str:
    failed = d.failed()
    if not failed:
        return ""
    rows = [[str(t.id), t.status, _reason(t.error), _config(t.config)] for t in failed[:MAX_FAILED_ROWS]]
    more = f" (the first {MAX_FAILED_ROWS} of {len(failed)})" if len(failed) > MAX_FAILED_ROWS else ""
    return f"<h4>Failed trials{more}</h4>" + _table(["trial", "status", "reason", "config"], rows)


def _problem_section(i: int, d: _ProblemData, plots: _Plots) -> str:
    parts = [f'<h3 id="problem-{i}">{escape(d.label)}</h3>']
    if d.ok():
        parts += [_time_per_config(d, plots), _history(d, plots), _importance(d, plots), _slices(d, plots)]
    else:
        parts.append("<p>No candidate passed.</p>")
    parts.append(_failed_trials(d))
    return "".join(parts)


MIN_SLICE_TRIALS = 3  # fewer ok trials show no trend worth a chart

STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; max-width: 1200px; }
table { border-collapse: collapse; margin: 1em 0; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
h3 { margin-top: 2em; border-top: 1px solid #ddd; padding-top: 1em; }
.note { color: #555; font-size: 13px; }
"""


@dataclasses.dataclass(frozen=True)
class Report:
    html: str
    figures: list[Any]  # plotly Figures, in page order


@dataclasses.dataclass(frozen=True)
class Sections:
    """A sweep's report without its page around it: the file and the service's sweep page both wrap it."""

    title: str
    body: str  # HTML for inside <body>, from the heading to the last problem's section
    figures: list[Any]  # plotly Figures, in page order; the body's divs need plotly.js loaded first


def render(store: Any, sweep_id: int) -> str:
    return build(store, sweep_id).html


def sections(store: Any, sweep_id: int) -> Sections:
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
    plots = _Plots()
    with_trials = [d for d in problems if d.trials]
    speedups = _speedups(problems, plots)
    failures = _failures(trials, plots)
    problem_sections = "".join(_problem_section(i, d, plots) for i, d in enumerate(with_trials, 1))
    contents = "".join(
        f'<li><a href="#problem-{i}">{escape(d.label)}</a></li>' for i, d in enumerate(with_trials, 1)
    )
    title = f"moetune sweep {sweep_id}"
    body = f"""<h1>{title}</h1>
{_table(["setting", "value"], facts)}
<h2>Winners</h2>
{_summary(problems, sweep.backend)}
<h2>Winner vs heuristic default and vs XLA per token bucket</h2>
{speedups}
<h2>Failures</h2>
{failures}
<h2>Per problem</h2>
<ul>{contents}</ul>
{problem_sections or "<p>No trial of the sweep's backend.</p>"}
"""
    return Sections(title, body, plots.figures)


def build(store: Any, sweep_id: int) -> Report:
    from plotly.offline import get_plotlyjs

    report = sections(store, sweep_id)
    generated = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    html = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{report.title}</title><style>{STYLE}</style>
<script>{get_plotlyjs()}</script></head>
<body>
{report.body}<p style="color:#888">generated {generated} by moetune</p>
</body></html>
"""
    return Report(html, report.figures)
