"""The scripts that only run on a GPU machine, checked on a CPU before a device run is spent on them: each
starts and parses its arguments, run exactly as `python3 benchmarks/<script>` runs it, and imports none of
the packages that machine may lack (Ray, Optuna, SQLAlchemy)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.benchmarks.scripts import BENCHMARKS

GPU_SCRIPTS = [
    "bench_backward.py",
    "bench_gemm.py",
    "bench_layer_grad.py",
    "bench_model.py",
    "device_kernel_check.py",
]
PROBE = """
import runpy, sys
script = sys.argv[1]
sys.argv = [script, "--help"]
sys.path.insert(0, sys.argv[0].rsplit("/", 1)[0])  # as `python3 benchmarks/<script>` does
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as e:
    print("exit", e.code)
print("loaded", sorted(m for m in ("ray", "optuna", "sqlalchemy") if m in sys.modules))
"""


@pytest.mark.parametrize("script", GPU_SCRIPTS)
def test_a_gpu_script_parses_its_arguments_on_a_cpu_without_the_tuners_dependencies(script):
    path = str(BENCHMARKS / script)
    run = subprocess.run(
        [sys.executable, "-c", PROBE, path],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=BENCHMARKS.parent,
    )
    assert "exit 0" in run.stdout and "usage:" in run.stdout, run.stdout + run.stderr
    assert "loaded []" in run.stdout, run.stdout
