"""Real sweeps on a real Ray cluster (2 workers) and a real database: the xla backend end to end, and a
backend whose variants crash, hang, raise and lie."""

from __future__ import annotations

import collections
import itertools

import pytest

from moetune.tuner.driver import SweepDriver
from moetune.tuner.plan import load_model, parse_problem
from moetune.tuner.ray_pool import RayExecutor
from moetune.tuner.spec import SweepSpec
from moetune.tuner.tasks import CandidateResult, canonical
from tests.tuner.faulty_backend import EXPECTED_STATUS

pytestmark = pytest.mark.slow


class Watched:
    """The executor, with every result it hands back kept for inspection."""

    def __init__(self, executor: RayExecutor) -> None:
        self.executor = executor
        self.results: list = []

    def __getattr__(self, name):
        return getattr(self.executor, name)

    def wait(self, timeout_s):
        results = self.executor.wait(timeout_s)
        self.results += results
        return results


@pytest.fixture
def executor(ray_cluster, request):
    timeout_s = getattr(request, "param", 60.0)
    pool = RayExecutor(workers=2, timeout_s=timeout_s)
    yield Watched(pool)
    pool.close()


def run(store, executor, spec, planned):
    sweep_id = store.create_sweep(backend=spec.backend, strategy=spec.strategy, spec={}, host="h", user="u")
    return SweepDriver(store, executor, spec, backend=spec.backend).run(planned, sweep_id=sweep_id)


def assert_timings_never_overlap(results):
    """On each device lane, no candidate was verified or timed while another one was."""
    timed = sorted(
        (r.device_started_at, r.finished_at)
        for r in results
        if isinstance(r, CandidateResult) and r.device_started_at
    )
    assert len(timed) >= 2
    for (_, end), (start, _) in itertools.pairwise(timed):
        assert start >= end, "two candidates used the device at the same time"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_xla_sweep_of_a_small_model(store, executor, db_url):
    planned = load_model("tiny").with_buckets((8,)).problems()
    spec = SweepSpec(backend="xla", routing="zipf:1.2")
    outcome = run(store, executor, spec, planned)
    assert outcome.status == "done" and executor.workers == 2
    assert list(executor.lanes()) == [f"{executor.worker_infos()[0].host}:cpu"]
    trials = store.trials(sweep_id=outcome.sweep_id)
    assert {t.status for t in trials} == {"ok"}
    assert {t.worker for t in trials} == {"w0", "w1"}  # both workers compiled
    for problem in outcome.problems:
        mine = [t for t in trials if t.problem.key == problem.problem_key]
        assert len(mine) == len({canonical(t.config) for t in mine}) == 10  # the pruned grid, once each
        assert problem.winner_config is not None and problem.winner_s
        assert problem.baseline_s and problem.heuristic_s
    assert_timings_never_overlap(executor.results)
    assert_phases_recorded(trials)


def assert_phases_recorded(trials):
    """Every trial's details hold its phases; a worker's first trial of a problem made the problem's
    inputs, references and rotations, and its later ones made none."""
    from moetune.tuner.candidate import PHASES, SETUP_PARTS

    seen = set()
    for t in sorted(trials, key=lambda t: t.started_at):
        phases = t.details["phases"]
        assert set(phases) == set(PHASES), t.details
        first = (t.worker, t.problem.key) not in seen
        seen.add((t.worker, t.problem.key))
        assert all((phases[p] > 0) == first for p in SETUP_PARTS), (first, phases)


# Long enough for a replacement worker's first compile (its process compiles every program cold): each
# crashed candidate runs once more, mostly on the worker that replaced the one it killed. The hang waits
# it out.
TIMEOUT_S = 15.0


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("executor", [TIMEOUT_S], indirect=True)
def test_faults_are_recorded_and_the_sweep_goes_on(store, faulty, executor):
    problem = parse_problem("m=32,k=32,n=32,g=4,dtype=f32")
    spec = SweepSpec(backend="faulty", timeout_s=TIMEOUT_S)
    outcome = run(store, executor, spec, [problem])
    assert outcome.status == "done"
    trials = store.trials(sweep_id=outcome.sweep_id, backend="faulty")
    by_mode = {t.config["mode"]: t for t in trials if t.config["variant"] == 0}
    assert set(by_mode) == set(EXPECTED_STATUS)
    for mode, trial in by_mode.items():
        assert trial.status == EXPECTED_STATUS[mode], f"{mode}: {trial.status} ({trial.error})"
        assert trial.status == "ok" or trial.error
    counts = collections.Counter(t.status for t in trials)
    assert counts == {"ok": 2, "crashed": 4, "compile_error": 1, "timeout": 1, "wrong_result": 2}
    # A crashed candidate ran once more on another worker before its crash was final: it crashed twice.
    for trial in trials:
        first = (trial.details or {}).get("first_attempt")
        assert (first is not None) == (trial.status == "crashed"), trial
        assert first is None or (first["status"] == "crashed" and first["error"] and first["worker"])
    assert f"no result within {TIMEOUT_S:g}s while compiling" in by_mode["hang"].error
    assert (
        "while compiling" in by_mode["segfault"].error
        and "while verifying and timing" in by_mode["exit_run"].error
    )
    # The winner is a correct variant, although "wrong" returned fastest.
    assert outcome.problems[0].winner_config["mode"] == "ok"
    # Dead and hung workers were replaced, and the replacements did work.
    assert {t.worker for t in trials} - {"w0", "w1"}
    assert_timings_never_overlap(executor.results)
