"""SweepDriver's stop (what `moetune worker` does on SIGTERM): nothing new is submitted, every candidate
already handed to the executor is run and recorded, and the sweep ends interrupted."""

from __future__ import annotations

import threading

import pytest

from moetune.tuner.driver import SweepDriver
from moetune.tuner.executors import InlineExecutor
from moetune.tuner.spec import SweepSpec
from moetune.tuner.tasks import CandidateTask
from tests.tuner import sim_backend
from tests.tuner.test_driver import DEVICE, PROBLEM


def test_stop_finishes_what_is_in_flight_records_it_and_interrupts(store, sim):
    stop, ran = threading.Event(), []

    def runner(task):
        if isinstance(task, CandidateTask) and task.backend == "sim":
            ran.append(task.config["tile"])
            if len(ran) == 2:
                stop.set()  # while more candidates wait in the executor
        return sim_backend.simulate(task)

    executor = InlineExecutor(runner, DEVICE)
    spec = SweepSpec(backend="sim", baseline=False)
    sweep_id = store.create_sweep(backend="sim", strategy=spec.strategy, spec={}, host="h", user="u")
    driver = SweepDriver(store, executor, spec, backend="sim", poll_s=0, stop=stop)
    with pytest.raises(KeyboardInterrupt):
        driver.run([PROBLEM], sweep_id=sweep_id)
    recorded = sorted(t.config["tile"] for t in store.trials(sweep_id=sweep_id))
    assert recorded == sorted(ran) and 2 <= len(ran) < len(sim_backend.TILES)
    assert executor.in_flight() == 0 and store.get_sweep(sweep_id).status == "interrupted"
