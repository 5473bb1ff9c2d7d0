"""Per-problem progress rows and the workers' set-up in the live display."""

from __future__ import annotations

import pytest
from rich.console import Console

from moetune.tuner import executors, progress
from moetune.tuner.driver import SweepDriver
from moetune.tuner.executors import InlineExecutor, WorkerActivity
from moetune.tuner.plan import parse_problem
from moetune.tuner.progress import ProblemProgress, RichProgress, Snapshot, setup_snapshot, summary_line
from moetune.tuner.spec import SweepSpec
from tests.tuner import sim_backend
from tests.tuner.sim_sweeps import DEVICE, RecordingProgress

STARTING = WorkerActivity("GPU0", "", executors.STARTING)
PREPARING = WorkerActivity(
    "GPU1", "node:gpu1", executors.PREPARING, "t1", "mixtral gate_up T=64 tile=2", first_of_problem=True
)


def rendered(*snapshots: Snapshot) -> str:
    console = Console(record=True, width=160)
    display = RichProgress(console=console)
    display.start(snapshots[0])
    for snapshot in snapshots[1:]:
        display.update(snapshot)
    display.close(snapshots[-1])
    return console.export_text()


def test_each_problem_has_a_row_with_its_trials_and_phase():
    snapshot = Snapshot(
        60.0,
        3,
        10,
        {"ok": 3},
        {"node:gpu0": "idle"},
        [],
        problems=[
            ProblemProgress("gate_up T=64", 3, 8, progress.TIMING),
            ProblemProgress("down T=64", 0, 2, "waiting"),
        ],
    )
    text = rendered(snapshot)
    assert "gate_up T=64" in text and "3/8" in text and "timing" in text
    assert "down T=64" in text and "0/2" in text and "waiting" in text


def test_set_up_is_shown_in_the_lanes_panel_before_and_during_the_sweep():
    text = rendered(
        setup_snapshot("starting the Ray cluster", 0.0), setup_snapshot("starting workers", 5.0, [STARTING])
    )
    assert "set-up: starting workers" in text and "GPU0 (set-up)" in text and "importing JAX" in text
    line = summary_line(setup_snapshot("starting workers", 5.0, [STARTING, PREPARING]))
    assert line.startswith("set-up: starting workers, elapsed 0:05")
    assert "GPU1 preparing inputs and references, compiling: mixtral gate_up T=64 tile=2" in line
    assert progress.setup_rows([WorkerActivity("GPU2", "node:gpu2", executors.TIMING, "t2")]) == {}


def test_a_problems_phase_follows_its_run_and_what_its_tasks_do():
    phase = progress.problem_phase
    assert phase("search", [], {}) == progress.WAITING
    assert phase("search", ["a"], {"a": executors.PREPARING}) == progress.COMPILING
    assert phase("search", ["a"], {"a": executors.WAITING}) == progress.COMPILING  # compiled, lane busy
    assert phase("search", ["a", "b"], {"a": executors.COMPILING, "b": executors.TIMING}) == progress.TIMING
    assert phase("search", ["a"], {}) == progress.RUNNING
    assert phase("retime", ["r"], {"r": executors.TIMING}) == progress.RETIMING
    assert phase("settled", [], {}) == phase("done", [], {}) == progress.DONE
    assert phase("skipped", [], {}) == progress.SKIPPED


class TimingExecutor(InlineExecutor):
    """Holds two tasks and runs one per wait, so one is in flight at each snapshot; says its queued tasks
    are being timed, and that another worker prepares a problem."""

    def capacity(self) -> int:
        return 2 - len(self._queue)

    def activity(self) -> list[WorkerActivity]:
        queued = [WorkerActivity("w0", "lane0", executors.TIMING, t.task_id, t.label) for t in self._queue]
        return [*queued, PREPARING]


def test_the_driver_reports_each_problems_trials_phase_and_the_workers_set_up(store, sim):
    planned = [parse_problem("m=8,k=64,n=64,g=4,dtype=bf16"), parse_problem("m=4,k=64,n=64,g=4,dtype=bf16")]
    spec = SweepSpec(backend="sim", strategy="grid", baseline=False, budget=3)
    sweep_id = store.create_sweep(backend="sim", strategy="grid", spec={}, host="h", user="u")
    display = RecordingProgress()
    driver = SweepDriver(
        store, TimingExecutor(sim_backend.simulate, DEVICE), spec, backend="sim", progress=display, poll_s=0
    )
    driver.run(planned, sweep_id=sweep_id)
    first, last = display.snapshots[0], display.snapshots[-1]
    labels = [p.label for p in planned]
    assert [(p.label, p.done, p.planned, p.phase) for p in first.problems] == [
        (label, 0, 3, progress.WAITING) for label in labels
    ]
    assert [(p.label, p.done, p.planned, p.phase) for p in last.problems] == [
        (label, 3, 3, progress.DONE) for label in labels
    ]
    phases = {p.phase for s in display.snapshots for p in s.problems}
    assert {progress.TIMING, progress.RETIMING} <= phases
    assert first.setup == {"GPU1": "preparing inputs and references, compiling: mixtral gate_up T=64 tile=2"}


def test_ray_workers_say_whether_a_task_is_their_first_of_its_problem():
    from moetune.tuner import ray_pool
    from moetune.tuner.tasks import CandidateTask

    task = CandidateTask(
        "t1", "sim", parse_problem("m=8,k=64,n=64,g=4,dtype=bf16").problem, {"tile": 1}, (), ()
    )
    slot = ray_pool._Slot("GPU0", actor=None)
    assert ray_pool._activity(slot).state == executors.STARTING
    slot.phase, slot.task, slot.first_of_problem = "prepare", task, True
    first = ray_pool._activity(slot)
    assert (first.state, first.task_id, first.first_of_problem) == (executors.PREPARING, "t1", True)
    slot.first_of_problem = False
    assert ray_pool._activity(slot).state == executors.COMPILING
    slot.phase = "ready"
    assert ray_pool._activity(slot).state == executors.WAITING
    slot.phase = "run"
    assert ray_pool._activity(slot).state == executors.TIMING


@pytest.mark.slow
def test_ray_workers_starting_are_reported_until_they_are_up(ray_cluster):
    from moetune.tuner.ray_pool import RayExecutor

    seen: list[list[WorkerActivity]] = []
    pool = RayExecutor(workers=2, timeout_s=60.0, on_starting=seen.append)
    try:
        assert seen and {a.state for a in seen[0]} == {executors.STARTING}
        assert len(seen[0]) == 2
        assert {a.state for a in pool.activity()} == {executors.IDLE}
    finally:
        pool.close()
