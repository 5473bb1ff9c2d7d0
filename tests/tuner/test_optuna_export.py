"""`moetune export-optuna`: a sweep of any strategy written to an Optuna storage and read back with
optuna.load_study, one study per problem, parameters in the search space's own values."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import TrialState
from typer.testing import CliRunner

from moetune.cli import _load_commands, app
from moetune.db import open_store
from moetune.kernels.backends.xla import space as xla_space
from moetune.kernels.problem import Problem
from moetune.tuner.optuna_export import export
from moetune.tuner.tasks import OK
from tests.tuner.sim_sweeps import recorded_sweep, run_sim_sweep

_load_commands()
PROBLEMS = ["m=8,k=64,n=64,g=4", "m=4,k=64,n=64,g=4"]
COSTS = {1: 2e-3, 2: None, 3: 1e-3, 5: 1.5e-3}


def invoke(*args, env=None):
    return CliRunner().invoke(app, list(args), env=env)


def storage_of(tmp_path):
    return f"sqlite:///{tmp_path / 'optuna.db'}"


@pytest.mark.parametrize("strategy", ["grid", "random", "tpe"])
def test_each_strategy_exports_one_study_per_problem_with_every_trial(store, sim, tmp_path, strategy):
    sweep_id = run_sim_sweep(store, PROBLEMS, strategy=strategy, costs=COSTS)
    storage = storage_of(tmp_path)
    names = export(store, sweep_id, storage)
    rows = store.trials(sweep_id=sweep_id, backend="sim")
    keys = sorted({r.problem.key for r in rows})
    assert names == [f"sweep{sweep_id}/{key}" for key in keys]
    for name, key in zip(names, keys, strict=True):
        study = optuna.load_study(study_name=name, storage=storage)
        assert study.direction == optuna.study.StudyDirection.MINIMIZE
        assert study.user_attrs["moetune_sweep_id"] == sweep_id and study.user_attrs["strategy"] == strategy
        mine = {r.id: r for r in rows if r.problem.key == key}
        exported = study.get_trials(deepcopy=False)
        assert sorted(t.user_attrs["moetune_trial_id"] for t in exported) == sorted(mine)
        for trial in exported:
            row = mine[trial.user_attrs["moetune_trial_id"]]
            assert trial.params == row.config and trial.user_attrs["config"] == row.config
            assert trial.distributions == {"tile": IntDistribution(1, 8)}  # sim's tiles 1..8, evenly spaced
            assert trial.user_attrs["status"] == row.status
            if row.status == OK:
                assert trial.state == TrialState.COMPLETE and trial.value == row.median_s
            else:
                assert trial.state == TrialState.FAIL and trial.value is None
                assert trial.user_attrs["error"] == "simulated wrong result"
        assert {t.state for t in exported} == {TrialState.COMPLETE, TrialState.FAIL}


def test_values_stay_faithful_for_categorical_uneven_and_outgrown_domains(store, tmp_path):
    problem = Problem("grouped_matmul", m=64, k=64, n=64, g=4)
    configs = [
        {"strategy": "ragged_dot", "chunk_m": 128, "items_per_step": 8},
        {"strategy": "chunked", "chunk_m": 32, "items_per_step": 2},
        {"strategy": "chunked", "chunk_m": 1000, "items_per_step": 2},  # outside today's domain
        {"strategy": "ragged_dot", "chunk_m": 64},  # recorded before items_per_step existed
        {
            "strategy": "ragged_dot",
            "chunk_m": 64,
            "items_per_step": 1,
            "order": [2, 0, 1],
        },  # no Optuna choice
    ]
    sweep_id = recorded_sweep(store, "xla", problem, configs, strategy="tpe")
    storage = storage_of(tmp_path)
    [name] = export(store, sweep_id, storage, prefix="mixtral-xla")
    assert name == f"mixtral-xla/{problem.key}"
    trials = optuna.load_study(study_name=name, storage=storage).get_trials()
    assert [t.params for t in trials] == configs[:-1] + [
        {k: v for k, v in configs[-1].items() if k != "order"}
    ]
    assert [t.user_attrs["config"] for t in trials] == configs
    distributions = trials[0].distributions
    assert distributions["strategy"] == CategoricalDistribution(list(xla_space.STRATEGIES))
    assert distributions["chunk_m"] == CategoricalDistribution([*xla_space.CHUNK_M, 1000])
    assert distributions["items_per_step"] == CategoricalDistribution(list(xla_space.ITEMS_PER_STEP))
    assert "items_per_step" not in trials[3].distributions


def test_cli_exports_and_refuses_a_name_already_in_the_storage_without_writing(sqlite_url, sim, tmp_path):
    with open_store(sqlite_url) as store:
        sweep_id = run_sim_sweep(store, PROBLEMS[:1], costs=COSTS)
    storage = storage_of(tmp_path)
    first = invoke("export-optuna", str(sweep_id), "--storage", storage, "--db", sqlite_url)
    assert first.exit_code == 0, first.output
    assert f"wrote 1 study to {storage}" in first.output and f"optuna-dashboard {storage}" in first.output
    [name] = optuna.get_all_study_names(storage)
    count = len(optuna.load_study(study_name=name, storage=storage).trials)
    again = invoke(
        "export-optuna", str(sweep_id), "--db", sqlite_url, env={"MOETUNE_OPTUNA_STORAGE": storage}
    )
    assert again.exit_code == 2 and again.output.count("\n") == 1
    assert f"already holds study '{name}'" in again.output
    assert optuna.get_all_study_names(storage) == [name]
    assert len(optuna.load_study(study_name=name, storage=storage).trials) == count
    renamed = invoke(
        "export-optuna",
        str(sweep_id),
        "--study-name",
        "second",
        "--db",
        sqlite_url,
        env={"MOETUNE_OPTUNA_STORAGE": storage},
    )
    assert renamed.exit_code == 0, renamed.output
    assert 'optuna-dashboard "$MOETUNE_OPTUNA_STORAGE"' in renamed.output  # not the URL it may hide
    assert sorted(optuna.get_all_study_names(storage)) == sorted([name, f"second/{name.split('/', 1)[1]}"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--storage", "postgresql+psycopg://tuner:s3cret@db.example/optuna"], "set $MOETUNE_OPTUNA_STORAGE"),
        ([], "no storage: give --storage URL or set $MOETUNE_OPTUNA_STORAGE"),
        (["--storage", "not a url"], "--storage: not a database URL"),
    ],
)
def test_bad_storage_arguments_are_one_line_exit_2_and_write_nothing(
    sqlite_url, sim, tmp_path, args, message
):
    with open_store(sqlite_url) as store:
        sweep_id = run_sim_sweep(store, PROBLEMS[:1], costs=COSTS)
    result = invoke(
        "export-optuna", str(sweep_id), *args, "--db", sqlite_url, env={"MOETUNE_OPTUNA_STORAGE": ""}
    )
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert message in result.output and "s3cret" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".db") == ["moetune.db"]


def test_an_unknown_sweep_is_refused_before_the_storage_is_created(sqlite_url, tmp_path):
    storage = storage_of(tmp_path)
    result = invoke("export-optuna", "41", "--storage", storage, "--db", sqlite_url)
    assert result.exit_code == 2 and "no sweep with id 41" in result.output
    assert not (tmp_path / "optuna.db").exists()


def test_a_failure_while_writing_leaves_no_study_behind(sqlite_url, sim, tmp_path, monkeypatch):
    with open_store(sqlite_url) as store:
        sweep_id = run_sim_sweep(store, PROBLEMS, costs=COSTS)
        calls = []
        real = optuna.Study.add_trials

        def second_fails(self, trials):
            calls.append(self.study_name)
            if len(calls) == 2:
                raise RuntimeError("disk full")
            real(self, trials)

        monkeypatch.setattr(optuna.Study, "add_trials", second_fails)
        storage = storage_of(tmp_path)
        with pytest.raises(RuntimeError, match="disk full"):
            export(store, sweep_id, storage)
    assert len(calls) == 2 and optuna.get_all_study_names(storage) == []
