"""The scripts that only run on a GPU machine, checked on a CPU before a device run is spent on them: each
Python script starts and parses its arguments, run exactly as `python3 benchmarks/<script>` runs it, and
imports none of the packages that machine may lack (Ray, Optuna, SQLAlchemy); each device shell script
parses as bash."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.benchmarks.scripts import BENCHMARKS, ROOT

GPU_SCRIPTS = [
    "benchmarks/bench_backward.py",
    "benchmarks/bench_block.py",
    "benchmarks/bench_fp8.py",
    "benchmarks/bench_gemm.py",
    "benchmarks/bench_layer_grad.py",
    "benchmarks/bench_maxtext.py",
    "benchmarks/bench_model.py",
    "benchmarks/device_kernel_check.py",
    "examples/train_moe.py",  # run by device_train_example.sh
]
DEVICE_SHELL_SCRIPTS = sorted(path.name for path in BENCHMARKS.glob("device_*.sh"))
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
    path = str(ROOT / script)
    run = subprocess.run(
        [sys.executable, "-c", PROBE, path],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert "exit 0" in run.stdout and "usage:" in run.stdout, run.stdout + run.stderr
    assert "loaded []" in run.stdout, run.stdout


def test_the_glob_finds_the_device_shell_scripts():
    assert "device_train_example.sh" in DEVICE_SHELL_SCRIPTS and "device_env.sh" in DEVICE_SHELL_SCRIPTS


@pytest.mark.parametrize("script", DEVICE_SHELL_SCRIPTS)
def test_a_device_shell_script_parses_as_bash(script):
    run = subprocess.run(["bash", "-n", str(BENCHMARKS / script)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
