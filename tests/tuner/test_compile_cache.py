"""Workers can share compiled programs through JAX's persistent compilation cache: each worker is its own
process, and on a GPU a worker's first trial of a problem spends most of its time compiling the problem's
set-up programs (inputs, reference, checks). The driver's JAX_* settings reach the workers."""

from __future__ import annotations

import json
import subprocess
import sys

from moetune.tuner.ray_pool import worker_env

# One worker's first trial of a problem, in a fresh process: how many XLA programs it compiled and how many
# it took from the persistent cache.
TRIAL = """
import json, jax
from moetune.kernels.problem import Problem
from moetune.tuner.candidate import CandidateRunner
from moetune.tuner.tasks import CandidateTask
events = {"hits": 0, "misses": 0}
def note(event, **kwargs):
    if event == "/jax/compilation_cache/cache_hits": events["hits"] += 1
    if event == "/jax/compilation_cache/cache_misses": events["misses"] += 1
jax.monitoring.register_event_listener(note)
problem = Problem("grouped_matmul", m=48, k=32, n=64, g=4, lhs_dtype="f32", rhs_dtype="f32", out_dtype="f32")
sizes = ((12, 12, 12, 12),)
task = CandidateTask("t", "xla", problem, {"strategy": "ragged_dot"}, sizes, sizes + ((10, 0, 20, 8),))
result = CandidateRunner("w").evaluate(task)
print(json.dumps({"status": result.status, **events}))
"""


def _trial(env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", TRIAL], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_worker_takes_the_set_up_programs_from_the_shared_cache(tmp_path, monkeypatch):
    import os

    cache = {
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "xla-cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
        "JAX_COMPILATION_CACHE_MAX_SIZE": str(1 << 30),
    }
    for name, value in cache.items():
        monkeypatch.setenv(name, value)
    env = dict(os.environ) | worker_env()  # what a Ray worker would see
    assert all(env[name] == value for name, value in cache.items())
    first, second = _trial(env), _trial(env)
    assert first["status"] == second["status"] == "ok"
    assert first["misses"] > 0 and first["hits"] == 0
    assert second["hits"] >= first["misses"] and second["misses"] == 0
