"""Winners as decided, through the command line: `tune` (its table and --json), the live table, `best` and
`report` show the re-timed medians that decided a winner and the decision, never a winner slower than
the heuristic it beat.

The sweep runs the simulated backend in process: by single medians the heuristic default (tile 1,
1.00 ms) is ahead of tile 2 (1.05 ms); re-timed side by side, tile 2 takes 0.90 ms and the heuristic
1.20 ms, so tile 2 wins.
"""

from __future__ import annotations

import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from moetune.cli import _load_commands, app
from moetune.tuner import sweep_setup
from moetune.tuner.executors import InlineExecutor
from moetune.tuner.tasks import RetimeTask
from tests.tuner import sim_backend
from tests.tuner.sim_sweeps import DEVICE

_load_commands()
PROBLEM = "m=8,k=64,n=64,g=4"
SWEEP_COSTS = {1: 1.00e-3, 2: 1.05e-3}  # every other tile: 2 ms
RETIMED = {1: 1.20e-3, 2: 0.90e-3}


def runner(task):
    """The simulated runner, with re-timing answering RETIMED where single medians answer COSTS."""
    if isinstance(task, RetimeTask):
        per_config = tuple(
            sim_backend.samples(RETIMED.get(c["tile"], 2e-3), task.rounds * task.runs_per_round)
            for c in task.configs
        )
        return type(sim_backend.simulate(task))(task.task_id, per_config, worker="sim")
    return sim_backend.simulate(task)


@pytest.fixture
def in_process(sim, monkeypatch):
    sim_backend.COSTS.update({tile: SWEEP_COSTS.get(tile, 2e-3) for tile in sim_backend.TILES})

    def make_executor(spec, inline=False, on_starting=None):
        return InlineExecutor(runner, DEVICE), False

    monkeypatch.setattr(sweep_setup, "make_executor", make_executor)


def invoke(*args, **options):
    result = CliRunner().invoke(app, list(args), **options)
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def tune(sqlite_url, *flags):
    return invoke(
        "tune", "--problem", PROBLEM, "--backend", "sim", "--no-baseline", *flags, "--db", sqlite_url
    )


def test_tune_json_shows_the_re_timed_medians_that_decided_and_the_decision(in_process, sqlite_url):
    outcome = json.loads(tune(sqlite_url, "--json").stdout)
    [row] = outcome["problems"]
    winner, heuristic = row["winner"], row["heuristic"]
    assert winner["config"] == {"tile": 2} and winner["config_diff"] == {"tile": 2}
    assert (winner["median_s"], winner["source"]) == (pytest.approx(0.90e-3, rel=0.01), "retimed")
    assert winner["sweep_median_s"] == pytest.approx(1.05e-3, rel=0.01)
    assert (heuristic["median_s"], heuristic["basis"]) == (pytest.approx(1.20e-3, rel=0.01), "retimed")
    assert heuristic["ratio"] == pytest.approx(1.20 / 0.90, rel=0.01) and heuristic["ratio"] > 1
    assert heuristic["config"] == {"tile": sim_backend.HEURISTIC_TILE}
    decision = row["decision"]
    assert decision["rule"] == "first_winner" and decision["sweep_id"] == outcome["sweep_id"]
    assert {f["trial_id"] for f in decision["finalists"]} >= {winner["trial_id"]}
    assert row["xla"] is None and isinstance(row["m"], int) and row["tokens"] is None


def test_tune_table_prints_the_winner_faster_than_the_heuristic_it_beat(in_process, sqlite_url):
    out = tune(sqlite_url).stdout
    (line,) = [line for line in out.splitlines() if PROBLEM in line]
    cells = [c.strip() for c in line.split("│")]
    # problem, op, m, trials, winner ms, its sweep ms, heuristic ms, xla ms, ratios, config, decided by
    assert cells[5:10] == ["0.9", "1.05", "1.2 re-timed", "-", "1.33x"]
    assert "tile=2" in line and "first winner" in line
    assert "(rows m only: T unknown)" in out


def test_best_and_report_show_the_decided_time_with_the_decision(in_process, sqlite_url, tmp_path):
    sweep_id = json.loads(tune(sqlite_url, "--json").stdout)["sweep_id"]
    (row,) = json.loads(invoke("best", "--no-packs", "--json", "--db", sqlite_url).stdout)
    assert row["decided"] == {"median_s": pytest.approx(0.90e-3, rel=0.01), "source": "retimed"}
    assert row["median_s"] == pytest.approx(1.05e-3, rel=0.01)  # the trial's own (sweep) median
    assert row["decision"]["rule"] == "first_winner" and row["problem"]["op"] == "grouped_matmul"
    table = invoke("best", "--no-packs", "--db", sqlite_url).stdout
    assert "times in ms" in table and f"re-timed: first winner (sweep {sweep_id}" in table
    out = tmp_path / "r.html"
    report = json.loads(
        invoke("report", str(sweep_id), "--out", str(out), "--json", "--db", sqlite_url).stdout
    )
    assert report == {"sweep_id": sweep_id, "file": str(out), "bytes": out.stat().st_size}
    html = out.read_text()
    assert "<td>0.9</td><td>1.05</td><td>1.2 re-timed</td>" in html and "1.33x" in html
    assert f"first winner (sweep {sweep_id}, 5 interleaved rounds)" in html


def test_the_live_table_switches_from_best_so_far_to_the_winner_as_decided(sim, store):
    from moetune.tuner.driver import SweepDriver
    from moetune.tuner.plan import parse_problem
    from moetune.tuner.progress import Progress, RichProgress
    from moetune.tuner.spec import SweepSpec

    sim_backend.COSTS.update({tile: SWEEP_COSTS.get(tile, 2e-3) for tile in sim_backend.TILES})
    seen = []

    class Recording(Progress):
        def update(self, snapshot):
            seen.append(snapshot)

        close = update

    spec = SweepSpec(backend="sim", baseline=False)
    driver = SweepDriver(store, InlineExecutor(runner, DEVICE), spec, backend="sim", progress=Recording())
    sweep_id = store.create_sweep(backend="sim", strategy="grid", spec={}, host="h", user="u")
    driver.run([parse_problem(PROBLEM)], sweep_id=sweep_id)
    searching = next(s.best[0] for s in seen if s.best[0].state == "searching" and s.best[0].time)
    assert searching.time.source == "sweep"
    final = seen[-1].best[0]
    assert (final.state, final.config, final.time.source) == ("decided", {"tile": 2}, "retimed")
    assert final.heuristic.ratio > 1
    console = Console(record=True, width=200)
    progress = RichProgress(console=console)
    progress.start(seen[-1])
    progress.close(seen[-1])
    text = console.export_text()
    assert "decided" in text and "0.9 re-timed" in text and "1.2 re-timed" in text and "1.33x" in text


def test_a_winner_without_a_decision_shows_its_recorded_median_labelled_so(in_process, sqlite_url):
    import sqlalchemy as sa

    tune(sqlite_url)
    engine = sa.create_engine(sqlite_url)
    with engine.begin() as connection:  # as a winner promoted before decisions were kept
        connection.execute(sa.text("UPDATE winners SET decision = NULL"))
    engine.dispose()
    (row,) = json.loads(invoke("best", "--no-packs", "--json", "--db", sqlite_url).stdout)
    assert row["decided"] == {"median_s": pytest.approx(1.05e-3, rel=0.01), "source": "recorded"}
    assert row["decision"] is None
    table = invoke("best", "--no-packs", "--db", sqlite_url, env={"COLUMNS": "200"}).stdout
    assert "recorded median (no decision kept)" in table and "1.05" in table
