"""Sweeps of the "slow_device" backend on fresh local Ray clusters that claim 1, 2, ... GPUs.

Run as a child process by test_multi_gpu_scheduling.py: a process joins one Ray cluster at a time, and
the test session's own cluster (CPU only, its address in use by other tests) must stay as it is. The
GPUs are Ray resources only; JAX runs on the CPU, but Ray still gives each worker a GPU id and sets
CUDA_VISIBLE_DEVICES, as on a GPU host.

    python -m tests.tuner.fake_gpu_sweep --gpus 1 2 --workers 4 --db-dir DIR --out result.json
    python -m tests.tuner.fake_gpu_sweep --gpus 2 --resource amd_gpu ...   (the "slow_amd" backend, on
        a cluster that declares 2 units of the custom resource `amd_gpu` and no Ray GPUs)

For each GPU count, on one cluster and one set of workers: a warm-up sweep (every worker makes each
problem's inputs and compiles its verification once: CPU work that more lanes do not speed up on a
2-core machine), then the measured sweep of every config. Writes one JSON object to --out, per GPU
count: the workers and their lanes, how much of the device resource they hold, the measured sweep (each
candidate's device interval, the trials recorded) and every timing call the workers logged.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from pathlib import Path

from moetune.db import open_store
from moetune.kernels import registry
from moetune.tuner import ray_pool
from moetune.tuner.driver import SweepDriver
from moetune.tuner.plan import parse_problem
from moetune.tuner.spec import SweepSpec
from moetune.tuner.tasks import CandidateResult
from tests.tuner import slow_amd_backend, slow_device_backend

REPO = Path(__file__).resolve().parents[2]
# Problems that differ only in M share their weights: less setup per problem in every worker.
PROBLEMS = ("m=16,k=32,n=32,g=4,dtype=f32", "m=32,k=32,n=32,g=4,dtype=f32")


class Recording:
    """The executor, with every candidate result it hands back kept."""

    def __init__(self, executor: ray_pool.RayExecutor) -> None:
        self.executor = executor
        self.candidates: list[CandidateResult] = []

    def __getattr__(self, name):
        return getattr(self.executor, name)

    def wait(self, timeout_s):
        results = self.executor.wait(timeout_s)
        self.candidates += [r for r in results if isinstance(r, CandidateResult)]
        return results


def start_cluster(gpus: int, cpus: int, resource: str) -> None:
    """A new local cluster, never one found through RAY_ADDRESS; its workers inherit this environment.
    `gpus` devices, as Ray's GPUs or as units of the custom `resource`."""
    import ray

    ray.init(
        address="local",
        num_cpus=cpus,
        num_gpus=gpus if resource == "GPU" else 0,
        resources=None if resource == "GPU" else {resource: gpus},
        _node_ip_address="127.0.0.1",
        object_store_memory=ray_pool.OBJECT_STORE_BYTES,
        include_dashboard=False,
        logging_level=logging.WARNING,
        log_to_driver=False,
    )


def sweep(executor: ray_pool.RayExecutor, db_url: str, budget: int | None, backend: str) -> dict:
    """Up to `budget` configs of every problem (all when None), recorded in a fresh database."""
    spec = SweepSpec(
        backend=backend,
        budget=budget,
        baseline=False,
        finalists=1,
        retime_rounds=1,
        timeout_s=executor.timeout_s,
        workers=executor.workers,
    )
    recording = Recording(executor)
    with open_store(db_url) as store:
        sweep_id = store.create_sweep(
            backend=spec.backend, strategy=spec.strategy, spec={}, host="h", user="u"
        )
        driver = SweepDriver(store, recording, spec, backend=spec.backend)
        outcome = driver.run([parse_problem(p) for p in PROBLEMS], sweep_id=sweep_id)
        trials = store.trials(sweep_id=sweep_id)
    return {
        "status": outcome.status,
        "candidates": [
            {
                "worker": r.worker,
                "status": r.status,
                "device_start": r.device_started_at.timestamp(),
                "end": r.finished_at.timestamp(),
            }
            for r in recording.candidates
        ],
        "trials": [
            {
                "problem": t.problem.key,
                "config": t.config,
                "status": t.status,
                "worker": t.worker,
                "lane": (t.details or {}).get("lane"),
            }
            for t in trials
        ],
        "winners": sum(1 for p in outcome.problems if p.winner_config is not None),
    }


def run(gpus: int, workers: int, db_dir: Path, resource: str) -> dict:
    backend = (slow_device_backend if resource == "GPU" else slow_amd_backend).BACKEND
    with tempfile.TemporaryDirectory() as scratch:
        # Workers inherit the environment of the process that starts the cluster.
        os.environ[slow_device_backend.LOG_ENV] = scratch
        # A compilation cache shared by this cluster's workers: each helper compiles once, not per worker.
        os.environ["JAX_COMPILATION_CACHE_DIR"] = str(Path(scratch) / "jax-cache")
        start_cluster(gpus, cpus=workers, resource=resource)
        try:
            executor = ray_pool.RayExecutor(
                workers=workers,
                timeout_s=60.0,
                device_resource=backend.device_resource,
                visible_devices_env=backend.visible_devices_env,
            )
            try:
                sweep(executor, f"sqlite:///{db_dir / f'warmup-{gpus}'}.db", workers, backend.name)
                started = time.time()  # timing calls from here on belong to the measured sweep
                measured = sweep(executor, f"sqlite:///{db_dir / f'sweep-{gpus}'}.db", None, backend.name)
                infos = executor.worker_infos()
                lanes = sorted(executor.lanes())
                held = _held(resource)
            finally:
                executor.close()
        finally:
            ray_pool.disconnect()
        logged = [
            json.loads(line) for log in Path(scratch).glob("*.jsonl") for line in log.read_text().splitlines()
        ]
    return {
        "lanes": lanes,
        "held": held,
        "workers": [{"name": w.name, "pid": w.pid, "lane": w.lane} for w in infos],
        "sweep": measured,
        "timings": [t for t in logged if t["start"] >= started],
    }


def _held(resource: str) -> float:
    """How much of the device resource the cluster's actors hold (Ray reports usage with a short lag)."""
    import ray

    held = 0.0
    for _ in range(50):
        held = ray.cluster_resources().get(resource, 0) - ray.available_resources().get(resource, 0)
        if held:
            break
        time.sleep(0.1)
    return held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--db-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--resource", default="GPU", help="a custom device resource, e.g. amd_gpu")
    args = parser.parse_args()

    os.environ.pop("RAY_ADDRESS", None)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    registry.register(slow_device_backend.BACKEND.name, "tests.tuner.slow_device_backend")
    registry.register(slow_amd_backend.BACKEND.name, "tests.tuner.slow_amd_backend")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    results = {str(gpus): run(gpus, args.workers, args.db_dir, args.resource) for gpus in args.gpus}
    args.out.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
