"""One worker's view: compile, verify and time a candidate in this process, with real backends."""

from __future__ import annotations

import statistics

from moetune.kernels.problem import Problem
from moetune.tuner.candidate import CandidateRunner, Prepared
from moetune.tuner.routing import parse_routings, verification_draws
from moetune.tuner.tasks import CandidateResult, CandidateTask, RetimeTask

PROBLEM = Problem("grouped_matmul", m=64, k=32, n=64, g=4, lhs_dtype="f32", rhs_dtype="f32", out_dtype="f32")
ROUTINGS = parse_routings("zipf:1.2")
TIMING = tuple(tuple(int(x) for x in r.group_sizes(PROBLEM.m, PROBLEM.g, seed=0)) for r in ROUTINGS)
DRAWS = tuple(
    tuple(int(x) for x in d) for d in verification_draws(ROUTINGS, PROBLEM.m, PROBLEM.g, seed=0, count=2)
)


def task(backend: str, config: dict, task_id: str = "t") -> CandidateTask:
    return CandidateTask(task_id, backend, PROBLEM, config, TIMING, DRAWS, runs=10)


def test_a_good_candidate_is_compiled_verified_and_timed():
    runner = CandidateRunner("w")
    prepared = runner.prepare(task("xla", {"strategy": "chunked", "chunk_m": 16, "items_per_step": 4}))
    assert isinstance(prepared, Prepared) and prepared.compile_s > 0
    result = runner.run(prepared)
    assert isinstance(result, CandidateResult)
    assert result.status == "ok", result.error
    assert len(result.samples_s) == 10 and all(s > 0 for s in result.samples_s)
    assert result.median_s == statistics.median(result.samples_s)
    assert result.verify_error is not None and result.verify_error < 1e-5
    assert result.worker == "w" and result.host
    assert result.started_at <= result.finished_at


def test_statuses_by_phase(faulty):
    runner = CandidateRunner("w")
    bad_field = runner.evaluate(task("xla", {"strategy": "chunked", "tile": 3}))
    assert bad_field.status == "compile_error" and "unknown XlaConfig fields: tile" in bad_field.error
    raised = runner.evaluate(task("faulty", {"mode": "raise", "variant": 0}))
    assert raised.status == "compile_error" and "injected failure while building" in raised.error
    assert raised.samples_s == () and raised.median_s is None
    wrong = runner.evaluate(task("faulty", {"mode": "wrong", "variant": 0}))
    assert wrong.status == "wrong_result" and "relative error" in wrong.error
    nan = runner.evaluate(task("faulty", {"mode": "nan", "variant": 0}))
    assert nan.status == "wrong_result" and "NaN" in nan.error
    raised_on_device = runner.evaluate(task("faulty", {"mode": "raise_run", "variant": 0}))
    assert raised_on_device.status == "crashed" and "raised during verify" in raised_on_device.error
    assert runner.evaluate(task("faulty", {"mode": "ok", "variant": 1})).status == "ok"


def test_retime_interleaves_every_finalist():
    configs = (
        {"strategy": "ragged_dot", "chunk_m": 128, "items_per_step": 8},
        {"strategy": "chunked", "chunk_m": 7},
    )
    retime = RetimeTask("r", "xla", PROBLEM, configs, TIMING, rounds=3, runs_per_round=4)
    result = CandidateRunner().evaluate(retime)
    assert len(result.samples_s[0]) == 12
    assert result.samples_s[1] == ()  # chunk_m=7 is not a multiple of 8: it never compiled
    assert "chunk_m=7" in result.error


def test_candidates_of_a_problem_share_one_reference_per_draw_and_one_rotation(monkeypatch):
    """The device phase is serialised per GPU: nothing that depends only on the problem may be redone per
    candidate, even when the driver interleaves problems on one worker."""
    from moetune.kernels.timing import WallTimer

    rotations = 0
    real_rotation = WallTimer.rotation

    def counted_rotation(self, arg_sets):
        nonlocal rotations
        rotations += 1
        return real_rotation(self, arg_sets)

    monkeypatch.setattr(WallTimer, "rotation", counted_rotation)
    other = Problem(
        "grouped_matmul", m=32, k=32, n=64, g=4, lhs_dtype="f32", rhs_dtype="f32", out_dtype="f32"
    )
    other_timing = tuple(tuple(int(x) for x in r.group_sizes(other.m, other.g, seed=0)) for r in ROUTINGS)
    other_draws = tuple(
        tuple(int(x) for x in d) for d in verification_draws(ROUTINGS, other.m, other.g, seed=0, count=2)
    )
    configs = [
        {"strategy": "ragged_dot"},
        {"strategy": "chunked", "chunk_m": 16, "items_per_step": 4},
        {"strategy": "chunked", "chunk_m": 8, "items_per_step": 2},
    ]
    runner = CandidateRunner("w")
    for i, config in enumerate(configs):  # problems alternate, as the driver interleaves them
        assert runner.evaluate(task("xla", config, f"a{i}")).status == "ok"
        mixed = CandidateTask(f"b{i}", "xla", other, config, other_timing, other_draws, runs=10)
        assert runner.evaluate(mixed).status == "ok"
    assert len(set(DRAWS)) == len(set(other_draws)) == 2
    # The reference is computed once per (problem, draw); the rotation once per problem.
    assert runner.cache.made["reference"] == 4 and rotations == 2
    assert runner.cache.made["inputs"] == 2


def test_several_routings_each_sample_is_the_mean_of_one_run_on_each(monkeypatch):
    from moetune.kernels.timing import WallTimer

    # A timer whose "time" is the number of rows routed to expert 0: balanced and skewed draws differ.
    def fake_time(self, fn, rotation, runs):
        sizes = rotation.sets[0][2]
        return [float(sizes[0]) + i for i in range(runs)]

    monkeypatch.setattr(WallTimer, "time", fake_time)
    routings = parse_routings("balanced,zipf:1.2")
    timing = tuple(tuple(int(x) for x in r.group_sizes(PROBLEM.m, PROBLEM.g, seed=0)) for r in routings)
    assert timing[0][0] != timing[1][0]
    mixed = CandidateTask("m", "xla", PROBLEM, {"strategy": "ragged_dot"}, timing, DRAWS, runs=10)
    result = CandidateRunner("w").evaluate(mixed)
    assert result.status == "ok", result.error
    assert list(result.samples_s) == [(timing[0][0] + timing[1][0]) / 2 + i for i in range(10)]


def test_the_device_phase_compiles_nothing_and_makes_only_the_references():
    # On a GPU, every XLA program that first runs inside `run` holds the device's lane while it compiles:
    # inputs, rotations and every program must be made or compiled in `prepare`. The references alone are
    # computed in `run`, under the lane: they are heavy device work that would disturb others' timings.
    import jax

    compiles: list[str] = []

    def listener(event: str, duration: float, **kwargs) -> None:
        if event == "/jax/compilation_cache/compile_requests_use_cache" or "backend_compile" in event:
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        runner = CandidateRunner("w")
        prepared = runner.prepare(task("xla", {"strategy": "chunked", "chunk_m": 8, "items_per_step": 2}))
        assert isinstance(prepared, Prepared) and compiles
        made = dict(runner.cache.made)
        assert "reference" not in made
        compiles.clear()
        result = runner.run(prepared)
        assert result.status == "ok", result.error
        assert dict(runner.cache.made) == made | {"reference": len(DRAWS)}
        assert compiles == []
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def test_a_candidate_is_timed_on_every_routing_in_one_call_of_the_timer(monkeypatch):
    """One `time_each` per candidate (and per finalist and round when re-timing): the CUPTI timer opens
    one profiling session per call, which costs more than the timed passes."""
    from moetune.kernels.timing import WallTimer

    calls: list[list[tuple[int, ...]]] = []
    real_time_each = WallTimer.time_each

    def recorded(self, fn, rotations, *, runs, warmed):
        calls.append([tuple(int(x) for x in rotation.sets[0][2]) for rotation in rotations])
        return real_time_each(self, fn, rotations, runs=runs, warmed=warmed)

    monkeypatch.setattr(WallTimer, "time_each", recorded)
    routings = parse_routings("balanced,zipf:1.2")
    timing = tuple(tuple(int(x) for x in r.group_sizes(PROBLEM.m, PROBLEM.g, seed=0)) for r in routings)
    candidate = CandidateTask("c", "xla", PROBLEM, {"strategy": "ragged_dot"}, timing, DRAWS, runs=10)
    assert CandidateRunner("w").evaluate(candidate).status == "ok"
    assert calls == [list(timing)]

    calls.clear()
    configs = ({"strategy": "ragged_dot"}, {"strategy": "chunked", "chunk_m": 8, "items_per_step": 2})
    result = CandidateRunner("w").evaluate(RetimeTask("r", "xla", PROBLEM, configs, timing, rounds=2))
    assert result.error == "" and calls == [list(timing)] * 4


def test_a_baseline_is_timed_with_the_sweep_backends_timer_when_that_timer_takes_any_jax_program(monkeypatch):
    from moetune.kernels.timing import WallTimer

    class Marked(WallTimer):
        def __init__(self, mark: float, any_program: bool) -> None:
            super().__init__()
            self.mark, self.times_any_jax_program = mark, any_program

        def time(self, fn, arg_sets, *, runs=10):
            return [self.mark] * runs

    timers = {
        "xla": Marked(1.0, True),
        "cupti_like": Marked(2.0, True),
        "code_object_only": Marked(3.0, False),
    }
    monkeypatch.setattr(CandidateRunner, "_timer", lambda self, backend: timers[backend])
    for borrowed, expected in (("", 1.0), ("cupti_like", 2.0), ("code_object_only", 1.0)):
        baseline = CandidateTask(
            "b", "xla", PROBLEM, {"strategy": "ragged_dot"}, TIMING, DRAWS, runs=10, timer_backend=borrowed
        )
        result = CandidateRunner("w").evaluate(baseline)
        assert result.status == "ok" and set(result.samples_s) == {expected}, (borrowed, result)


def test_a_workers_later_trials_of_a_problem_redo_no_set_up(monkeypatch):
    from moetune.tuner import verify

    runner = CandidateRunner("w")
    config = {"strategy": "chunked", "chunk_m": 8, "items_per_step": 2}
    assert isinstance(runner.prepare(task("xla", config, "first")), Prepared)
    calls: list[str] = []
    real_compare, real_nan_filled = verify._compare, verify._nan_filled
    monkeypatch.setattr(verify, "_compare", lambda *a: calls.append("compare") or real_compare(*a))
    monkeypatch.setattr(verify, "_nan_filled", lambda *a: calls.append("poison") or real_nan_filled(*a))
    assert isinstance(runner.prepare(task("xla", config, "second")), Prepared)
    assert calls == []


def test_a_trial_carries_its_phase_times_and_a_workers_second_trial_of_a_problem_sets_up_nothing():
    from moetune.tuner.candidate import PHASES, SETUP_PARTS

    runner = CandidateRunner("w")
    config = {"strategy": "chunked", "chunk_m": 8, "items_per_step": 2}
    first, second = (runner.evaluate(task("xla", config, t)) for t in ("first", "second"))
    assert first.status == second.status == "ok", (first.error, second.error)
    for result in (first, second):
        assert set(result.phases) == set(PHASES)
        assert result.phases["verify_s"] > 0 and result.phases["time_s"] > 0
        assert result.phases["lane_wait_s"] >= 0
        assert result.phases["setup_s"] >= sum(result.phases[p] for p in SETUP_PARTS)
    assert all(first.phases[p] > 0 for p in SETUP_PARTS), first.phases
    assert all(second.phases[p] == 0 for p in SETUP_PARTS), second.phases
    assert second.phases["setup_s"] < first.phases["setup_s"] / 10


def test_the_lane_wait_is_the_time_between_prepare_and_run():
    runner = CandidateRunner("w")
    prepared = runner.prepare(task("xla", {"strategy": "ragged_dot"}))
    assert isinstance(prepared, Prepared)
    prepared.ready_at -= 5.0  # as if it had waited 5 s for the lane
    assert 5.0 <= runner.run(prepared).phases["lane_wait_s"] < 6.0


def test_a_failed_trial_keeps_the_phases_it_reached(faulty):
    runner = CandidateRunner("w")
    wrong = runner.evaluate(task("faulty", {"mode": "wrong", "variant": 0}))
    assert wrong.status == "wrong_result" and wrong.phases["verify_s"] > 0 and "time_s" not in wrong.phases
    assert runner.evaluate(task("faulty", {"mode": "raise", "variant": 0})).phases is None  # never set up


def test_a_backend_that_compiles_on_the_device_is_compiled_in_run_where_the_lane_is_held(monkeypatch):
    """XLA on a GPU autotunes its GEMMs on the device while compiling: compiled in `prepare`, beside
    another worker's timing, the sweep's XLA baselines slowed those timings up to 2.5x on the H200."""
    from moetune.kernels.backends.xla.backend import XlaBackend

    monkeypatch.setattr(XlaBackend, "compiles_on_device", lambda self: True)
    runner = CandidateRunner("w")
    prepared = runner.prepare(task("xla", {"strategy": "ragged_dot"}))
    assert isinstance(prepared, Prepared) and prepared.compile_in_run
    assert prepared.executables == [] and prepared.compile_s == 0.0
    prepared.ready_at -= 5.0  # as if it had waited 5 s for the lane
    result = runner.run(prepared)
    assert result.status == "ok", result.error
    assert result.compile_s > 0
    assert 5.0 <= result.phases["lane_wait_s"] < 5.0 + result.compile_s  # the compile is not lane wait

    bad = runner.prepare(task("xla", {"strategy": "chunked", "tile": 3}))
    assert isinstance(bad, Prepared)
    bad.ready_at -= 2.0
    failed = runner.run(bad)
    assert failed.status == "compile_error"
    assert failed.phases["lane_wait_s"] >= 2.0 and failed.device_started_at is not None


def test_an_unknown_backend_is_a_compile_error_not_an_exception():
    result = CandidateRunner("w").prepare(task("no_such_backend", {}))
    assert result.status == "compile_error" and "no_such_backend" in result.error


def test_only_xla_on_a_gpu_compiles_on_the_device():
    from moetune.kernels import registry

    assert not registry.get("xla").compiles_on_device()  # these tests run on a CPU
    assert not registry.get("mosaic_gpu").compiles_on_device()
