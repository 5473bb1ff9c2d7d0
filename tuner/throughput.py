"""Tuner throughput: variants per minute (compiled + verified + timed) of a Ray sweep against the same
candidates compiled and timed one by one in one process, in one run.

Both runs are the same sweep (same problems, same grid candidates, same verification and timing) on
fresh temporary SQLite databases, so neither skips configs the other did. The Ray run goes first:
its driver never opens the device, so the workers have it to themselves; the sequential run follows
in this process once the workers are gone. Ray's start-up (cluster and workers) is reported apart:
it is paid once per sweep, not per variant.

The sequential run may take only the first `sequential_budget` candidates of each problem (the grid's
order is the same in both runs, so they are the same candidates): one by one, a large budget would take
most of a device session, and a rate per minute needs no more than a few dozen variants.

Each mode also reports its best candidate per problem: two Ray runs of the same spec on different
clusters (one GPU, two GPUs) must agree on them within noise.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from moetune.tuner.driver import SweepDriver
from moetune.tuner.plan import PlannedProblem
from moetune.tuner.progress import default_progress
from moetune.tuner.spec import SweepSpec


@dataclasses.dataclass(frozen=True)
class ModeResult:
    mode: str  # "ray" | "sequential"
    workers: int
    variants: int
    elapsed_s: float
    startup_s: float
    mean_compile_s: float | None
    statuses: dict[str, int]
    best: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # problem key -> best trial

    @property
    def per_minute(self) -> float:
        return self.variants / self.elapsed_s * 60 if self.elapsed_s > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class ThroughputResult:
    backend: str
    device_kind: str
    problems: int
    ray: ModeResult
    sequential: ModeResult

    @property
    def speedup(self) -> float:
        return self.ray.per_minute / self.sequential.per_minute if self.sequential.per_minute else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for mode in ("ray", "sequential"):
            data[mode]["per_minute"] = getattr(self, mode).per_minute
        data["speedup"] = self.speedup
        return data


def _best_per_problem(trials: list[Any]) -> dict[str, dict[str, Any]]:
    best: dict[str, dict[str, Any]] = {}
    for t in trials:
        if t.status == "ok" and t.median_s is not None:
            key = t.problem.key
            if key not in best or t.median_s < best[key]["median_s"]:
                best[key] = {"config": t.config, "median_s": t.median_s}
    return best


def _sweep(
    executor: Any,
    spec: SweepSpec,
    backend: str,
    planned: list[PlannedProblem],
    db_dir: str,
    mode: str,
    *,
    workers: int,
    startup_s: float = 0.0,
) -> ModeResult:
    from moetune.db import open_store

    with open_store(f"sqlite:///{Path(db_dir) / f'{mode}.db'}") as store:
        sweep_id = store.create_sweep(
            backend=backend, strategy=spec.strategy, spec={"bench": mode}, host="", user=""
        )
        driver = SweepDriver(store, executor, spec, backend=backend, progress=default_progress())
        start = time.perf_counter()
        driver.run(planned, sweep_id=sweep_id)
        elapsed = time.perf_counter() - start
        trials = store.trials(sweep_id=sweep_id)
    statuses: dict[str, int] = {}
    for t in trials:
        statuses[t.status] = statuses.get(t.status, 0) + 1
    compiles = [t.compile_s for t in trials if t.compile_s is not None]
    mean_compile = statistics.mean(compiles) if compiles else None
    return ModeResult(
        mode, workers, len(trials), elapsed, startup_s, mean_compile, statuses, _best_per_problem(trials)
    )


def measure(
    spec: SweepSpec,
    planned: list[PlannedProblem],
    backend_name: str | None = None,
    *,
    sequential_budget: int | None = None,
    sequential: bool = True,
) -> ThroughputResult:
    """Run `spec` on Ray, then in-process (unless `sequential` is False); `spec.budget` caps the candidates
    per problem, `sequential_budget` those of the in-process run."""
    from moetune.tuner import plan, ray_pool, sweep_setup
    from moetune.tuner.executors import InlineExecutor

    # The sequential run opens the device in this process; it must not reserve most of a GPU's memory.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    # Finalists are re-timed in both runs alike; the XLA baseline is not a variant of the backend.
    spec = dataclasses.replace(spec, baseline=False)
    with tempfile.TemporaryDirectory(prefix="moetune-bench-") as db_dir:
        start = time.perf_counter()
        started = ray_pool.connect(spec.ray_address)
        try:
            executor = ray_pool.RayExecutor(workers=spec.workers, timeout_s=spec.timeout_s)
            startup = time.perf_counter() - start
            try:
                backend = sweep_setup.resolve_backend(backend_name or spec.backend, executor.device)
                planned = plan.dispatched_on(planned, backend)
                ray_mode = _sweep(
                    executor,
                    spec,
                    backend.name,
                    planned,
                    db_dir,
                    "ray",
                    workers=executor.workers,
                    startup_s=startup,
                )
                device_kind = executor.device.device_kind
            finally:
                executor.close()
        finally:
            if started:
                ray_pool.disconnect()
        sequential_mode = ModeResult("sequential", 1, 0, 0.0, 0.0, None, {})
        if sequential:
            budgets = [b for b in (spec.budget, sequential_budget) if b is not None]
            one_by_one = dataclasses.replace(spec, budget=min(budgets) if budgets else None)
            sequential_mode = _sweep(
                InlineExecutor(), one_by_one, backend.name, planned, db_dir, "sequential", workers=1
            )
    return ThroughputResult(backend.name, device_kind, len(planned), ray_mode, sequential_mode)
