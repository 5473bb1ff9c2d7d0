"""Synthetic sweeps for the report and export tests: recorded trial by trial, or the simulated backend
(sim_backend.py) run by the real driver, in process, into a test store."""

from __future__ import annotations

from moetune.kernels.device import DeviceFingerprint
from moetune.tuner.driver import SweepDriver
from moetune.tuner.executors import InlineExecutor
from moetune.tuner.plan import parse_problem
from moetune.tuner.progress import Progress, Snapshot
from moetune.tuner.spec import SweepSpec
from tests.tuner import sim_backend

DEVICE = DeviceFingerprint("Simulated GPU", "gpu", 4, 1 << 30, "9.0", "1", "1", "0", "0")


class RecordingProgress(Progress):
    """A display that keeps every snapshot it is shown."""

    def __init__(self) -> None:
        self.snapshots: list[Snapshot] = []

    def start(self, snapshot: Snapshot) -> None:
        self.snapshots.append(snapshot)

    update = close = start


def run_sim_sweep(
    store,
    problems: list[str],
    *,
    strategy: str = "grid",
    costs: dict | None = None,
    device: DeviceFingerprint = DEVICE,
) -> int:
    """Sweep id of a finished sweep of the "sim" backend (register it with the `sim` fixture) over
    `problems` on `device`; `costs` maps a tile to its seconds, or to None for a wrong result."""
    sim_backend.COSTS.update(costs or {})
    planned = [parse_problem(p) for p in problems]
    spec = SweepSpec(backend="sim", strategy=strategy)
    stored = {"spec": spec.to_dict(), "problems": [p.to_dict() for p in planned], "device": device.to_dict()}
    sweep_id = store.create_sweep(backend="sim", strategy=strategy, spec=stored, host="h", user="u")
    driver = SweepDriver(store, InlineExecutor(sim_backend.simulate, device), spec, backend="sim")
    driver.run(planned, sweep_id=sweep_id)
    return sweep_id


def recorded_sweep(store, backend: str, problem, configs: list[dict], strategy: str = "grid") -> int:
    """Sweep id of a sweep of `backend` whose trials are `configs`, all ok, the i-th taking (i + 1) ms."""
    from tests.db import db_factories

    spec = {"spec": {}, "problems": [], "device": DEVICE.to_dict()}
    sweep_id = store.create_sweep(backend=backend, strategy=strategy, spec=spec, host="h", user="u")
    for i, config in enumerate(configs):
        record = db_factories.trial(
            config=config,
            median_s=1e-3 * (i + 1),
            device=DEVICE,
            backend=backend,
            problem=problem,
            sweep_id=sweep_id,
        )
        store.record_trial(record)
    return sweep_id
