"""The HTML report of a sweep: Plotly charts on log time axes, the two speedup ratios apart, the winner
with the decision that made it, parameter importance, failures, escaping, nothing loaded from elsewhere."""

from __future__ import annotations

import html.parser
import itertools

import pytest

from moetune.kernels import registry
from moetune.kernels.problem import Problem
from moetune.tuner import decided
from moetune.tuner.finalists import Finalist, decide
from moetune.tuner.report import build
from moetune.tuner.tasks import OK
from moetune.tuner.warm_start import baseline_config
from tests.db import db_factories
from tests.tuner import sim_backend
from tests.tuner.sim_sweeps import DEVICE, recorded_sweep, run_sim_sweep

# m=8: tiles 1..8 valid, 2 and 4 fail (6 ok); m=4: tiles 1..4 valid, 2 and 4 fail (2 ok: too few for
# parameter importance).
PROBLEMS = ["m=8,k=64,n=64,g=4", "m=4,k=64,n=64,g=4"]
COSTS = {1: 2e-3, 2: None, 3: 1e-3, 4: None, 5: 1.5e-3, 6: 1.2e-3, 7: 1.1e-3, 8: 1.3e-3}


@pytest.fixture
def sweep(store, sim):
    sweep_id = run_sim_sweep(store, PROBLEMS, costs=COSTS)
    return store, sweep_id, build(store, sweep_id)


def titled(report, words):
    return [f for f in report.figures if words in f.layout.title.text]


def problem_trials(store, sweep_id, m):
    trials = [t for t in store.trials(sweep_id=sweep_id, backend="sim") if t.problem.m == m]
    return sorted(trials, key=lambda t: t.id)


def test_report_of_a_sweep_with_failures(sweep):
    store, sweep_id, report = sweep
    html = report.html
    assert html.startswith("<!DOCTYPE html>")
    # Two ratio charts, the failures chart, per problem time per config and history, and importance, the
    # slices and the parallel coordinates for the problem with enough ok trials.
    assert len(report.figures) == 2 + 1 + 2 * 2 + 1 + 2
    assert html.count('class="plotly-graph-div"') == len(report.figures)
    assert "failed trials by status" in html and "wrong_result" in html and "simulated wrong result" in html
    assert "m=8,k=64,n=64,g=4" in html and "tile=3" in html
    [failures] = titled(report, "failed trials by status")
    assert dict(zip(failures.data[0].x, failures.data[0].y, strict=True)) == {"wrong_result": 4}
    assert "not enough trials (2 ok" in html  # m=4's importance


def test_time_per_config_is_on_a_log_axis_sorted_with_winner_heuristic_and_xla_marked(sweep):
    store, sweep_id, report = sweep
    [chart] = titled(report, "m=8,k=64,n=64,g=4: median time per config")
    assert chart.layout.xaxis.type == "log"
    bars = sorted(
        ((label, ms, trace.name) for trace in chart.data for label, ms in zip(trace.y, trace.x, strict=True)),
        key=lambda bar: int(bar[0].split()[0][1:]),  # labels are numbered "#1 ...", "#2 ..." top down
    )
    times = [ms for _, ms, _ in bars]
    assert times == sorted(times)
    ok = [t for t in problem_trials(store, sweep_id, 8) if t.status == OK]
    assert len(bars) == len(ok) + 1  # every ok config and the XLA baseline
    roles = {label.split(" ", 1)[1]: role for label, _, role in bars}
    winner = store.current_winner(fingerprint_hash=DEVICE.hash, backend="sim", problem_key=ok[0].problem.key)
    assert roles[f"tile={winner.config['tile']}"] == "winner"
    assert roles[f"tile={sim_backend.HEURISTIC_TILE}"] == "heuristic default"
    assert roles["xla ragged_dot (baseline)"] == "xla ragged_dot"
    assert [ms for label, ms, _ in bars if label.endswith("tile=5")] == [pytest.approx(COSTS[5] * 1e3)]


def test_history_shows_each_trial_and_the_best_so_far_in_recorded_order(sweep):
    store, sweep_id, report = sweep
    [chart] = titled(report, "m=8,k=64,n=64,g=4: optimisation history")
    assert chart.layout.yaxis.type == "log"
    trials, best = chart.data
    recorded = problem_trials(store, sweep_id, 8)
    ok = [(n, t.median_s * 1e3) for n, t in enumerate(recorded, 1) if t.status == OK]
    assert list(trials.x) == [n for n, _ in ok] and list(trials.y) == pytest.approx([ms for _, ms in ok])
    assert list(best.y) == pytest.approx(list(itertools.accumulate((ms for _, ms in ok), min)))


def test_the_two_speedup_ratios_have_a_chart_each_with_labelled_bars(sweep):
    store, sweep_id, report = sweep
    [vs_heuristic] = titled(report, "heuristic time / winner time")
    [vs_xla] = titled(report, "XLA time / winner time")
    for m in (8, 4):
        ok = [t for t in problem_trials(store, sweep_id, m) if t.status == OK]
        winner = store.current_winner(
            fingerprint_hash=DEVICE.hash, backend="sim", problem_key=ok[0].problem.key
        )
        [xla] = [
            t.median_s
            for t in store.trials(sweep_id=sweep_id, backend="xla")
            if t.problem.m == m and t.status == OK
        ]
        heuristic = next(t.median_s for t in ok if t.config["tile"] == sim_backend.HEURISTIC_TILE)
        for chart, expected in ((vs_heuristic, heuristic / winner.median_s), (vs_xla, xla / winner.median_s)):
            [trace] = chart.data  # one shape
            assert dict(zip(trace.x, trace.y, strict=True))[f"M={m}"] == pytest.approx(expected)
            assert trace.texttemplate == "%{y:.2f}x"


def test_parameter_importance_comes_from_optuna_over_the_ok_trials(sweep):
    _, _, report = sweep
    [chart] = titled(report, "m=8,k=64,n=64,g=4: parameter importance")
    assert "6 ok trials" in chart.layout.title.text
    assert list(chart.data[0].y) == ["tile"] and list(chart.data[0].x) == pytest.approx([1.0])
    assert not titled(report, "m=4,k=64,n=64,g=4: parameter importance")


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links = []

    def handle_starttag(self, tag, attrs):
        self.links += [(tag, name, value) for name, value in attrs if name in ("src", "href", "data")]


def test_the_page_loads_nothing_from_elsewhere(sweep):
    _, _, report = sweep
    parser = _Links()
    parser.feed(report.html)  # script bodies (plotly.js) are data to the parser, not tags
    assert all(value.startswith("#") for _, _, value in parser.links), parser.links
    assert "Plotly.newPlot" in report.html and len(report.html) > 1_000_000  # plotly.js is inline


def empty_sim_sweep(store):
    spec = {"spec": {}, "problems": [], "device": DEVICE.to_dict()}
    return store.create_sweep(backend="sim", strategy="grid", spec=spec, host="h", user="u")


def record_sim_trial(store, sweep_id, tile, seconds):
    problem = Problem("grouped_matmul", m=8, k=64, n=64, g=4)
    config = {"tile": tile}
    return store.record_trial(
        db_factories.trial(
            config=config, median_s=seconds, device=DEVICE, backend="sim", problem=problem, sweep_id=sweep_id
        )
    )


def test_a_winner_without_a_decision_slower_by_single_medians_says_so_beside_its_reason(store, sim):
    sweep_id = empty_sim_sweep(store)
    made = {
        tile: record_sim_trial(store, sweep_id, tile, seconds)
        for tile, seconds in ((sim_backend.HEURISTIC_TILE, 1.0e-3), (2, 1.05e-3), (3, 1.4e-3))
    }
    reason = f"sweep {sweep_id}: beats the winner by more than the noise: 0.97 ms vs 1.01 ms"
    store.promote(made[2], reason=reason)
    report = build(store, sweep_id)
    assert "no decision kept; single medians: heuristic 1 ms &lt; winner 1.05 ms" in report.html
    assert "1.05 recorded" in report.html and "1 sweep" in report.html
    assert reason in report.html
    [vs_heuristic] = titled(report, "heuristic time / winner time")
    [trace] = vs_heuristic.data
    assert list(trace.y) == pytest.approx([1.0 / 1.05]) and reason in trace.text[0]


def test_a_winner_is_shown_with_the_re_timed_medians_that_decided_it(store, sim):
    """Single medians rank the heuristic ahead; re-timed side by side, the winner was faster: the page
    shows the re-timed numbers, the ratio above 1, and the rule that decided."""
    sweep_id = empty_sim_sweep(store)
    heuristic = record_sim_trial(store, sweep_id, sim_backend.HEURISTIC_TILE, 1.0e-3)
    winner = record_sim_trial(store, sweep_id, 2, 1.05e-3)
    finalists = (
        Finalist(winner, {"tile": 2}, 1.05e-3),
        Finalist(heuristic, {"tile": sim_backend.HEURISTIC_TILE}, 1.0e-3),
    )
    decision = decide(finalists, [[0.9e-3] * 20, [1.2e-3] * 20], min_gain=0.02)
    heuristic_config = {"tile": sim_backend.HEURISTIC_TILE}
    record = decided.record(decision, sweep_id=sweep_id, rounds=5, heuristic=heuristic_config)
    store.promote(winner, reason=decision.reason, decision=record)
    report = build(store, sweep_id)
    assert "<td>0.9</td><td>1.05</td><td>1.2 re-timed</td>" in report.html and "1.33x" in report.html
    assert "first winner (sweep 1, 5 interleaved rounds)" in report.html
    [vs_heuristic] = titled(report, "heuristic time / winner time")
    assert list(vs_heuristic.data[0].y) == pytest.approx([1.2 / 0.9])


def test_every_text_is_escaped_in_the_page_and_in_the_charts(store, fake_backend):
    # A backend whose space cannot be built here: the charts use the values the trials hold.
    spec = {"spec": {"note": "<i>x</i>"}, "problems": [], "device": DEVICE.to_dict()}
    sweep_id = store.create_sweep(backend="fake", strategy="grid", spec=spec, host="h", user="u")
    evil = '<img src=x onerror="alert(1)">'
    for i, block_n in enumerate((64, 128, 256, 512, 1024, 2048)):
        config = {"block_m": 64, "block_n": block_n, "tag": f"{evil}{i % 2}"}
        store.record_trial(
            db_factories.trial(config=config, median_s=1e-3 * (i + 1), device=DEVICE, sweep_id=sweep_id)
        )
    store.record_trial(
        db_factories.trial(
            status="crashed",
            median_s=None,
            error="<script>alert(2)</script>",
            device=DEVICE,
            sweep_id=sweep_id,
        )
    )
    report = build(store, sweep_id)
    page_without_plotly_js = report.html.split("</script></head>", 1)[1]
    assert "<img" not in page_without_plotly_js and "<script>alert" not in page_without_plotly_js
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in report.html and "&lt;i&gt;x&lt;/i&gt;" in report.html
    labels = [
        label for f in report.figures for trace in f.data for label in (getattr(trace, "y", None) or ())
    ]
    texts = [str(label) for label in labels if "img" in str(label)]
    assert texts and all("<img" not in text and "&lt;img" in text for text in texts)
    [importance] = titled(report, "parameter importance")
    assert set(importance.data[0].y) == {"block_n", "tag"}  # block_m took one value only


def test_slices_and_parallel_coordinates_show_every_ok_trial_by_its_varying_parameters(sweep):
    store, sweep_id, report = sweep
    ok = [t for t in problem_trials(store, sweep_id, 8) if t.status == OK]
    [slices] = titled(report, "m=8,k=64,n=64,g=4: time by parameter value")
    [tiles] = slices.data
    expected = sorted((t.config["tile"], t.median_s * 1e3) for t in ok)
    assert sorted(zip(tiles.x, tiles.y, strict=True)) == expected
    [lines] = titled(report, "m=8,k=64,n=64,g=4: parameters of every ok trial")
    tile, median = lines.data[0].dimensions
    assert (tile.label, median.label) == ("tile", "median ms") and len(tile.values) == len(ok)
    assert not titled(report, "m=4,k=64,n=64,g=4: time by parameter value")  # 2 ok trials: no chart


def test_a_winner_kept_from_an_earlier_sweep_is_shown_and_said_to_be(store, sim):
    earlier, later = empty_sim_sweep(store), empty_sim_sweep(store)
    store.promote(record_sim_trial(store, earlier, 2, 0.9e-3), reason=f"sweep {earlier}: first winner")
    record_sim_trial(store, later, 1, 1.2e-3)
    record_sim_trial(store, later, 3, 1.0e-3)
    [chart] = titled(build(store, later), "median time per config")
    [winner] = [trace for trace in chart.data if trace.name == "winner"]
    assert list(winner.x) == pytest.approx([0.9]) and "timed outside this sweep" in winner.text[0]


def test_a_sweep_of_the_xla_backend_marks_its_own_ragged_dot_trial_instead_of_repeating_it(store):
    problem = Problem("grouped_matmul", m=64, k=64, n=64, g=4)
    configs = [baseline_config()] + [
        {"strategy": "chunked", "chunk_m": c, "items_per_step": 1} for c in (8, 16)
    ]
    [chart] = titled(build(store, recorded_sweep(store, "xla", problem, configs)), "median time per config")
    bars = [(label, trace.name) for trace in chart.data for label in trace.y]
    assert len(bars) == len(configs) and not [label for label, _ in bars if "(baseline)" in label]
    heuristic = registry.get("xla").heuristic(problem, DEVICE).to_dict()
    expected = "heuristic default" if heuristic == baseline_config() else "xla ragged_dot"
    assert [role for label, role in bars if "strategy=ragged_dot" in label] == [expected]
