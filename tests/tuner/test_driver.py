"""The sweep driver, run synchronously in-process on a simulated runner against real databases."""

from __future__ import annotations

import collections

import pytest

from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.space import SearchSpace
from moetune.tuner.driver import SweepDriver
from moetune.tuner.executors import InlineExecutor
from moetune.tuner.plan import PlannedProblem, parse_problem
from moetune.tuner.spec import SweepSpec
from moetune.tuner.sweep_setup import store_problems
from moetune.tuner.tasks import CandidateTask, canonical
from tests.tuner import sim_backend
from tests.tuner.sim_backend import SimConfig

DEVICE = DeviceFingerprint("Simulated GPU", "gpu", 4, 1 << 30, "9.0", "1", "1", "0", "0")
PROBLEM = parse_problem("m=8,k=64,n=64,g=4,dtype=bf16")  # every tile 1..8 is valid


def sweep(store, planned=(PROBLEM,), runner=sim_backend.simulate, sweep_id=None, **settings):
    spec = SweepSpec(backend="sim", **settings)
    if sweep_id is None:
        sweep_id = store.create_sweep(backend="sim", strategy=spec.strategy, spec={}, host="h", user="u")
    driver = SweepDriver(store, InlineExecutor(runner, DEVICE), spec, backend="sim", poll_s=0)
    return driver.run(list(planned), sweep_id=sweep_id)


def recording(calls: list):
    """A simulated runner that also notes the tile of every candidate it runs."""

    def run(task):
        if isinstance(task, CandidateTask) and task.backend == "sim":
            calls.append(task.config["tile"])
        return sim_backend.simulate(task)

    return run


def sim_trials(store, **filters):
    return [t for t in store.trials(**filters) if t.backend == "sim"]


def test_each_trial_is_written_before_the_next_candidate_runs(store, sim):
    sim_backend.COSTS.update({t: (10 - t) * 1e-4 for t in sim_backend.TILES})
    seen: list[int] = []

    def checking_runner(task):
        if isinstance(task, CandidateTask) and task.backend == "sim":
            # Every earlier candidate's row is already in the database.
            assert len(sim_trials(store)) == len(seen)
            seen.append(task.config["tile"])
        return sim_backend.simulate(task)

    outcome = sweep(store, runner=checking_runner)
    rows = sim_trials(store, sweep_id=outcome.sweep_id)
    assert sorted(seen) == list(sim_backend.TILES) and seen[0] == sim_backend.HEURISTIC_TILE
    assert len(rows) == len({canonical(r.config) for r in rows}) == 8
    assert all(r.status == "ok" and len(r.samples_s) == 10 and r.routing["group_sizes"] for r in rows)
    winner = store.current_winner(
        fingerprint_hash=DEVICE.hash, backend="sim", problem_key=PROBLEM.problem.key
    )
    assert winner.config == {"tile": 8}
    [result] = outcome.problems
    assert result.winner_config == {"tile": 8} and result.heuristic_s == pytest.approx(9e-4, rel=0.01)
    assert result.baseline_s == pytest.approx(sim_backend.DEFAULT_COST, rel=0.01)  # the xla baseline trial
    assert [t.config for t in store.trials(sweep_id=outcome.sweep_id, backend="xla")] == [
        {"strategy": "ragged_dot", "chunk_m": 128, "items_per_step": 8}
    ]
    assert store.get_sweep(outcome.sweep_id).status == "done"


def test_the_largest_problem_gets_the_first_worker_and_reports_keep_plan_order(store, sim):
    small, large = (parse_problem(f"m={m},k=64,n=64,g=4,dtype=bf16") for m in (8, 512))
    started: list[int] = []

    def noting_runner(task):
        if isinstance(task, CandidateTask) and task.backend == "sim":
            started.append(task.problem.m)
        return sim_backend.simulate(task)

    outcome = sweep(store, planned=(small, large), runner=noting_runner, baseline=False, budget=2)
    # One worker (the inline executor): whenever it is free, the larger problem is asked first.
    assert started == [512, 512, 8, 8]
    assert [p.problem_key for p in outcome.problems] == [small.problem.key, large.problem.key]


def test_failed_candidates_are_recorded_and_never_win(store, sim):
    sim_backend.COSTS.update({1: 5e-4, 2: None, 3: 4e-4, 4: None})  # 2 and 4 would be fastest if they counted
    outcome = sweep(store, planned=[parse_problem("m=4,k=64,n=64,g=4")], baseline=False)
    statuses = collections.Counter(r.status for r in sim_trials(store, sweep_id=outcome.sweep_id))
    assert statuses == {"ok": 2, "wrong_result": 2}  # tiles 5..8 are pruned for m=4
    assert outcome.problems[0].winner_config == {"tile": 3}


def test_interrupted_sweep_resumes_without_repeating_or_losing_trials(store, sim):
    calls = []

    def dies_after_three(task):
        if len(calls) == 3:
            raise KeyboardInterrupt
        return recording(calls)(task)

    sweep_id = store.create_sweep(backend="sim", strategy="grid", spec={}, host="h", user="u")
    with pytest.raises(KeyboardInterrupt):
        sweep(store, runner=dies_after_three, sweep_id=sweep_id, baseline=False)
    assert store.get_sweep(sweep_id).status == "interrupted"
    before = {r.id: canonical(r.config) for r in sim_trials(store, sweep_id=sweep_id)}
    assert len(before) == 3

    rerun = []
    outcome = sweep(store, runner=recording(rerun), sweep_id=sweep_id, baseline=False)
    after = {r.id: canonical(r.config) for r in sim_trials(store, sweep_id=sweep_id)}
    assert before.items() <= after.items()  # nothing lost
    assert len(after) == len(set(after.values())) == 8  # nothing repeated, everything done
    assert not set(before.values()) & {canonical({"tile": t}) for t in rerun}
    assert outcome.status == "done"

    # Another sweep of the same problem on the same device and kernel source times nothing again.
    again = []
    sweep(store, runner=recording(again), baseline=False)
    assert again == []


def test_budget_counts_this_sweeps_trials_including_resumed_ones(store, sim):
    sweep_id = store.create_sweep(backend="sim", strategy="random", spec={}, host="h", user="u")
    sweep(store, sweep_id=sweep_id, strategy="random", budget=3, baseline=False)
    assert len(sim_trials(store, sweep_id=sweep_id)) == 3
    sweep(
        store, sweep_id=sweep_id, strategy="random", budget=3, baseline=False
    )  # resumed: the budget is spent
    assert len(sim_trials(store, sweep_id=sweep_id)) == 3
    later = sweep(store, strategy="random", budget=2, baseline=False)  # a new sweep gets its own budget
    assert len(sim_trials(store, sweep_id=later.sweep_id)) == 2
    assert len(sim_trials(store)) == 5


@pytest.mark.parametrize("challenger_gain, promoted", [(0.01, False), (0.10, True)])
def test_a_new_winner_must_beat_the_current_one_beyond_the_minimum_gain(
    store, sim, challenger_gain, promoted
):
    sim_backend.COSTS.update(
        {1: 2e-3, 2: 1.5e-3, 3: 1e-3, 4: 1.2e-3, 5: 3e-3, 6: 1e-3 * (1 - challenger_gain)}
    )
    sweep(store, budget=4, baseline=False)  # tiles 1..4 in grid order: tile 3 wins
    key = PROBLEM.problem.key
    first = store.current_winner(fingerprint_hash=DEVICE.hash, backend="sim", problem_key=key)
    assert first.config == {"tile": 3}
    outcome = sweep(store, baseline=False)  # tiles 5..8, re-timed against the winner
    winner = store.current_winner(fingerprint_hash=DEVICE.hash, backend="sim", problem_key=key)
    assert (winner.config == {"tile": 6}) is promoted
    assert ("winner kept" in outcome.problems[0].decision) is not promoted


def test_warm_start_tries_heuristic_then_winners_of_neighbouring_m(store, sim):
    sim_backend.COSTS.update({5: 1e-4})
    neighbour = PlannedProblem(PROBLEM.problem.with_m(16), "neighbour")
    sweep(store, planned=[neighbour], baseline=False)  # tile 5 wins at m=16
    order = []
    sweep(store, runner=recording(order), baseline=False)
    assert order[:2] == [sim_backend.HEURISTIC_TILE, 5]
    assert sorted(order) == list(sim_backend.TILES)


def test_search_space_seeds_come_after_the_measured_warm_starts(store, sim, monkeypatch):
    seeds = (SimConfig(7), SimConfig(sim_backend.HEURISTIC_TILE))
    seeded = SearchSpace(
        SimConfig, {"tile": sim_backend.TILES}, (sim_backend.tile_fits,), seeding=lambda: seeds
    )
    monkeypatch.setattr(sim_backend.SimBackend, "search_space", lambda self, problem, device: seeded)
    sim_backend.COSTS.update({5: 1e-4})
    sweep(store, planned=[PlannedProblem(PROBLEM.problem.with_m(16), "neighbour")], baseline=False)
    order = []
    sweep(store, runner=recording(order), baseline=False)
    assert order[:3] == [sim_backend.HEURISTIC_TILE, 5, 7]  # heuristic, neighbour's winner, seed
    order.clear()
    # A narrowed space keeps only the seeds inside it.
    narrowed = PlannedProblem(PROBLEM.problem.with_m(32), "narrowed")
    sweep(store, planned=[narrowed], runner=recording(order), baseline=False, space={"tile": [5, 6]})
    assert sorted(order) == [5, 6]


def test_minutes_budget_stops_asking_and_leaves_the_smallest_problems(store, sim):
    clock = iter(range(0, 10_000, 30))  # every reading of the clock is 30 s later
    spec = SweepSpec(backend="sim", minutes=1.5, baseline=False)
    sweep_id = store.create_sweep(backend="sim", strategy="grid", spec={}, host="h", user="u")
    driver = SweepDriver(
        store,
        InlineExecutor(sim_backend.simulate, DEVICE),
        spec,
        backend="sim",
        clock=lambda: next(clock),
        poll_s=0,
    )
    # Planned first, but with fewer FLOPs than PROBLEM: workers go to the largest problems first, so this
    # is the one the deadline leaves for --resume.
    small = parse_problem("m=8,k=32,n=64,g=4,dtype=bf16")
    outcome = driver.run([small, PROBLEM], sweep_id=sweep_id)
    assert 0 < len(sim_trials(store, sweep_id=sweep_id)) < 8
    first, second = outcome.problems  # reported in plan order
    assert first.problem_key == small.problem.key
    assert first.decision.startswith("not reached: the sweep's --minutes ran out")
    assert "not reached" not in second.decision


def test_misses_and_stale_winners_become_problems(store, sim):
    from moetune.kernels import registry

    missed = parse_problem("m=64,k=64,n=64,g=4").problem
    store.record_miss(device=DEVICE, backend="sim", problem=missed)
    sweep(store, baseline=False)
    backend = registry.get("sim")
    assert [p.problem for p in store_problems(SweepSpec(misses=True), store, backend, DEVICE)] == [missed]
    assert store_problems(SweepSpec(stale=True), store, backend, DEVICE) == []  # the winner is current
    other_driver = DeviceFingerprint("Simulated GPU", "gpu", 4, 1 << 30, "9.0", "2", "1", "0", "0")
    stale = store_problems(SweepSpec(stale=True), store, backend, other_driver)
    assert [p.problem for p in stale] == [PROBLEM.problem] and "stale (device)" in stale[0].label
    # Once tuned on the device in question, a miss or a stale winner is not listed again.
    sweep(store, planned=[PlannedProblem(missed, "missed")], baseline=False)
    assert store_problems(SweepSpec(misses=True), store, backend, DEVICE) == []
    executor = InlineExecutor(sim_backend.simulate, other_driver)
    sweep_id = store.create_sweep(backend="sim", strategy="grid", spec={}, host="h", user="u")
    SweepDriver(store, executor, SweepSpec(backend="sim", baseline=False), backend="sim").run(
        stale, sweep_id=sweep_id
    )
    # Left: the problem that was only ever tuned under the first fingerprint.
    assert [p.problem for p in store_problems(SweepSpec(stale=True), store, backend, other_driver)] == [
        missed
    ]


def test_compile_only_sweep_records_statuses_and_duplicate_binaries(store, sim):
    from moetune.tuner.candidate import CandidateRunner
    from moetune.tuner.sweep_setup import resolve_target

    spec = SweepSpec(backend="sim", compile_only=True)
    backend, stand_in, target = resolve_target(spec, DEVICE)
    assert target == "sim-arch" and stand_in.device_kind == "sim-arch (compile-only)"
    sweep_id = store.create_sweep(backend="sim", strategy="grid", spec={}, host="h", user="u")
    executor = InlineExecutor(CandidateRunner("w").evaluate, DEVICE)
    driver = SweepDriver(
        store, executor, spec, backend="sim", compile_target=target, device=stand_in, poll_s=0
    )
    outcome = driver.run([PROBLEM], sweep_id=sweep_id)
    rows = {r.config["tile"]: r for r in sim_trials(store, sweep_id=sweep_id)}
    assert {t: r.status for t, r in rows.items()} == {
        1: "ok",
        2: "compile_error",
        3: "pruned",
        4: "pruned",
        5: "ok",
        6: "ok",
        7: "ok",
        8: "ok",
    }
    assert "simulated compiler crash" in rows[2].error and "spills" in rows[4].error
    # The binary's facts are the trial's details; without a device there is no routing to record.
    assert all(r.routing is None for r in rows.values())
    assert rows[6].details["duplicate_of"] == rows[5].id and "duplicate_of" not in rows[5].details
    assert rows[5].details["binary_hash"] == rows[6].details["binary_hash"] == "b56"
    assert rows[1].details == {"target": "sim-arch", "binary_hash": "b1", "metrics": {"vgprs": 64}}
    assert rows[1].median_s is None
    assert rows[4].details["metrics"] == {"vgprs": 256}  # pruned after compiling: its facts are kept
    assert rows[2].details == {"target": "sim-arch"}  # nothing compiled, only the target is known
    assert {r.device_kind for r in rows.values()} == {"sim-arch (compile-only)"}
    assert "4 worth timing, 1 duplicates" in outcome.problems[0].decision
    assert store.winners(backend="sim") == []  # nothing was timed, so nothing is promoted
    assert store.trials(backend="xla") == []  # and no baseline is timed either


def test_compile_only_sweep_finds_duplicates_among_earlier_sweeps_details(store, sim):
    """The binary hashes of earlier compile-only trials are read back from their stored details."""
    from moetune.tuner.candidate import CandidateRunner
    from moetune.tuner.sweep_setup import resolve_target

    spec = SweepSpec(backend="sim", compile_only=True, budget=5)
    _, stand_in, target = resolve_target(spec, DEVICE)

    def compile_sweep() -> dict[int, object]:
        sweep_id = store.create_sweep(backend="sim", strategy="grid", spec={}, host="h", user="u")
        executor = InlineExecutor(CandidateRunner("w").evaluate, DEVICE)
        driver = SweepDriver(
            store, executor, spec, backend="sim", compile_target=target, device=stand_in, poll_s=0
        )
        driver.run([PROBLEM], sweep_id=sweep_id)
        return {r.config["tile"]: r for r in sim_trials(store, sweep_id=sweep_id)}

    first = compile_sweep()
    assert 5 in first and 6 not in first
    second = compile_sweep()
    assert 6 in second and not set(first) & set(second)
    assert second[6].details["duplicate_of"] == first[5].id
    assert all("duplicate_of" not in r.details for t, r in second.items() if t != 6)


def test_the_baseline_borrows_the_sweep_backends_timer(store, sim):
    tasks: list[CandidateTask] = []

    def noting(task):
        if isinstance(task, CandidateTask):
            tasks.append(task)
        return sim_backend.simulate(task)

    sweep(store, runner=noting, budget=2)
    baselines = [t for t in tasks if t.backend == "xla"]
    assert len(baselines) == 1 and baselines[0].timer_backend == "sim"
    assert all(t.timer_backend == "" for t in tasks if t.backend == "sim")


def test_a_problem_with_filled_rows_is_timed_and_verified_on_routings_of_those_rows(store, sim):
    # A receive buffer of 8 rows of which 3 hold groups on average (expert parallelism's worst case).
    planned = PlannedProblem(PROBLEM.problem, "buffer", tokens=3, filled_rows=3)
    tasks = []

    def noting(task):
        if isinstance(task, CandidateTask) and task.backend == "sim":
            tasks.append(task)
        return sim_backend.simulate(task)

    sweep(store, planned=[planned], runner=noting, routing="balanced,zipf:1.2", baseline=False)
    assert tasks and all(sum(sizes) == 3 for task in tasks for sizes in task.timing_sizes)
    assert all(sum(sizes) <= 3 for task in tasks for sizes in task.verify_sizes)
    rows = sim_trials(store)
    assert {sum(sizes) for r in rows for sizes in r.routing["group_sizes"]} == {3}


def _two_kernel_sweep(store, **settings):
    from tests.tuner import two_kernel_backend

    spec = SweepSpec(backend="two_kernel", **settings)
    sweep_id = store.create_sweep(backend="two_kernel", strategy=spec.strategy, spec={}, host="h", user="u")
    executor = InlineExecutor(two_kernel_backend.simulate, DEVICE)
    SweepDriver(store, executor, spec, backend="two_kernel", poll_s=0).run([PROBLEM], sweep_id=sweep_id)
    trials = sorted(store.trials(sweep_id=sweep_id, backend="two_kernel"), key=lambda t: t.id)
    return [(t.config["a"], t.config["b"]) for t in trials]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_op_of_two_kernels_tries_each_kernels_fastest_parameters_together(store, db_url, two_kernel):
    """The heuristic (a=4, b=1) runs the first kernel fastest; the grid then walks b at a=1. Each time the
    second kernel's best b improves, the next trial is a=4 with that b: the two kernels' best together."""
    assert _two_kernel_sweep(store, strategy="grid", budget=6) == [
        (4, 1),
        (1, 1),
        (1, 2),
        (4, 2),
        (1, 3),
        (4, 3),
    ]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_recombination_a_rule_forbids_is_not_proposed(store, db_url, two_kernel):
    from tests.tuner import two_kernel_backend

    two_kernel_backend.FORBIDDEN.add((4, 2))
    assert _two_kernel_sweep(store, strategy="grid", budget=5) == [(4, 1), (1, 1), (1, 2), (1, 3), (4, 3)]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("strategy", ["random", "tpe"])
def test_every_strategy_takes_the_recombined_config_beside_its_own(store, db_url, two_kernel, strategy):
    """TPE is told the result of a config it did not propose; random's draws skip it."""
    configs = _two_kernel_sweep(store, strategy=strategy, budget=8)
    assert len(configs) == len(set(configs)) == 8 and configs[0] == (4, 1)
    # The heuristic ran the first kernel at its best (a=4): a trial that ran the second kernel faster than
    # any before (a higher b) is followed by that b with a=4, unless that pair ran already.
    for i, (_, b) in enumerate(configs[1:-1], start=1):
        if b > max(earlier for _, earlier in configs[:i]) and (4, b) not in configs[:i]:
            assert configs[i + 1] == (4, b), configs


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_later_sweep_recombines_the_kernel_times_an_earlier_one_recorded(store, db_url, two_kernel):
    assert _two_kernel_sweep(store, strategy="grid", budget=3) == [(4, 1), (1, 1), (1, 2)]
    # The next sweep of the problem reads those trials' kernel times back from their details.
    assert _two_kernel_sweep(store, strategy="grid", budget=1) == [(4, 2)]
