"""`moetune submit` and `moetune jobs`: tune's flags, tune's checks, one-line refusals that write nothing."""

from __future__ import annotations

import json

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from moetune.cli import _load_commands, app
from moetune.db import open_store
from moetune.tuner.spec import SweepSpec

PROBLEM = "m=16,k=64,n=256,g=4,dtype=bf16"


def invoke(*args: str, env: dict[str, str] | None = None):
    _load_commands()
    return CliRunner().invoke(app, list(args), env=env)


def _options(name: str) -> set[str]:
    _load_commands()
    command = get_command(app).commands[name]
    return {option for param in command.params for option in param.opts}


def test_submit_takes_tunes_flags_less_those_of_where_it_runs():
    from moetune.cli.submit import NOT_QUEUED

    tune_only = {"--ray-address", "--resume", "--dry-run", "--inline", "--force"}
    assert len(NOT_QUEUED) == len(tune_only) + 1  # and --json, which submit has for its own output
    assert _options("submit") == (_options("tune") - tune_only) | {"--priority", "--device-kind"}


def test_submit_queues_the_spec_tune_would_run_without_a_database_url(sqlite_url, tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"backend: xla\nproblems: ['{PROBLEM}']\nbudget: 4\n")
    result = invoke(
        "submit",
        "--sweep",
        str(sweep),
        "--budget",
        "3",
        "--no-baseline",
        "--priority",
        "2",
        "--json",
        env={"MOETUNE_DB": sqlite_url},
    )
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    with open_store(sqlite_url) as store:
        (job,) = store.jobs()
    assert shown["id"] == job.id and (job.state, job.priority, job.attempts) == ("queued", 2, 0)
    assert job.sweep_file == str(sweep.resolve())
    spec = SweepSpec.from_dict(job.spec)
    assert (spec.backend, spec.problems, spec.budget, spec.baseline) == ("xla", (PROBLEM,), 3, False)
    assert (spec.db, spec.ray_address) == (None, None)
    assert sqlite_url not in json.dumps(job.spec)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--problem", "m=bad"], "missing k, n, g"),
        (["--problem", PROBLEM, "--budget", "0"], "budget=0"),
        (["--backend", "xla"], "nothing to tune"),
        (["--problem", PROBLEM, "--backend", "nosuch"], "nosuch"),
        (["--problem", PROBLEM, "--priority", str(2**40)], "--priority"),
        (["--problem", PROBLEM, "--device-kind", ""], "--device-kind"),
        (["--sweep", "no-such-sweep"], "no sweep file"),
        (["--problem", PROBLEM, "--resume", "1"], "--resume"),
    ],
)
def test_bad_submissions_are_one_line_exit_2_and_write_nothing(args, message, tmp_path):
    db = tmp_path / "queue.db"
    result = invoke("submit", "--db", f"sqlite:///{db}", *args)
    assert result.exit_code == 2 and message in result.stderr, result.output
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert not db.exists()


def test_jobs_list_show_and_cancel(sqlite_url):
    env = {"MOETUNE_DB": sqlite_url}
    for priority in ("0", "5"):
        assert invoke("submit", "--problem", PROBLEM, "--priority", priority, env=env).exit_code == 0
    listed = json.loads(invoke("jobs", "list", "--json", env=env).stdout)
    assert [(j["id"], j["state"], j["priority"]) for j in listed] == [(2, "queued", 5), (1, "queued", 0)]
    assert "m=16,k=64,n=256,g=4" in invoke("jobs", "list", env=env).stdout
    assert json.loads(invoke("jobs", "show", "2", "--json", env=env).stdout)["spec"]["problems"] == [PROBLEM]
    assert invoke("jobs", "cancel", "1", env=env).exit_code == 0
    again = invoke("jobs", "cancel", "1", env=env)
    assert again.exit_code == 2 and "ended already" in again.stderr
    missing = invoke("jobs", "show", "7", env=env)
    assert missing.exit_code == 2 and "no job with id 7" in missing.stderr
    states = json.loads(invoke("jobs", "list", "--state", "queued", "--json", env=env).stdout)
    assert [j["id"] for j in states] == [2]


@pytest.mark.parametrize("value", ["soon", "0", "-1"])
def test_a_bad_lease_time_stops_the_worker_before_it_opens_a_database(value, tmp_path):
    from moetune.db.jobs import GRACE_ENV

    db = tmp_path / "queue.db"
    result = invoke("worker", "--once", "--db", f"sqlite:///{db}", env={GRACE_ENV: value})
    assert result.exit_code == 2 and GRACE_ENV in result.stderr and result.stderr.count("\n") == 1
    assert not db.exists()


def test_a_worker_with_once_on_an_empty_queue_exits_cleanly(sqlite_url):
    with open_store(sqlite_url):
        pass  # the queue's database exists, with no job in it (--once refuses one not created)
    result = invoke("worker", "--once", "--db", sqlite_url)
    assert result.exit_code == 0 and "the queue is empty" in result.stderr
