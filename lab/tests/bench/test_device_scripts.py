"""The scripts that only run on a GPU machine, checked on a CPU before a device run is spent on them: each
Python script starts and parses its arguments, run exactly as `python3 lab/bench/<script>` runs it, and
imports none of the packages that machine may lack (Ray, Optuna, SQLAlchemy); each device shell script
parses as bash, and those that time-box their steps share one set of time boxes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]  # the repository: device scripts run from its root
DEVICE = ROOT / "lab" / "device"

GPU_SCRIPTS = [
    "lab/bench/bench_backward.py",
    "lab/bench/bench_block.py",
    "lab/bench/bench_fp8.py",
    "lab/bench/bench_gemm.py",
    "lab/bench/bench_layer_grad.py",
    "lab/bench/bench_maxtext.py",
    "lab/model/cli.py",
    "lab/bench/device_kernel_check.py",
    "examples/train_moe.py",  # run by lab/device/train_example.sh
]
DEVICE_SHELL_SCRIPTS = sorted(path.name for path in DEVICE.glob("*.sh"))
PROBE = """
import runpy, sys
script = sys.argv[1]
sys.argv = [script, "--help"]
sys.path.insert(0, sys.argv[0].rsplit("/", 1)[0])  # as `python3 lab/bench/<script>` does
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
    assert "train_example.sh" in DEVICE_SHELL_SCRIPTS and "env.sh" in DEVICE_SHELL_SCRIPTS


@pytest.mark.parametrize("script", DEVICE_SHELL_SCRIPTS)
def test_a_device_shell_script_parses_as_bash(script):
    run = subprocess.run(["bash", "-n", str(DEVICE / script)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr


def _timebox(script: str, deadline_in_s: int) -> str:
    """What `script` prints in bash with lab/device/timebox.sh sourced and DEADLINE that far away."""
    deadline = f"DEADLINE=$(( $(date +%s) + {deadline_in_s} ))"
    run = subprocess.run(
        ["bash", "-c", f"source lab/device/timebox.sh; {deadline}; {script}"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_a_step_gets_its_own_time_box_or_what_is_left_but_never_less_than_five_seconds():
    assert _timebox("cap 30", 1000) == "30"
    assert 990 <= int(_timebox("cap 5000", 1000)) <= 1000
    assert _timebox("cap 30", -100) == "5"
    assert int(_timebox("left", -100)) <= -100
    assert "=== [" in _timebox("step tests", 10) and _timebox("step tests", 10).endswith("tests")


def test_the_device_scripts_that_box_their_steps_take_the_shared_time_boxes():
    sources = ("source lab/device/env.sh", "source lab/device/timebox.sh")
    boxed = {}
    for script in DEVICE_SHELL_SCRIPTS:
        text = (DEVICE / script).read_text()
        if script != "timebox.sh" and any(use in text for use in ("$(cap ", "$(left)", "\nstep ")):
            boxed[script] = text
    assert {"maxtext.sh", "finegrained.sh", "e2e.sh"} <= set(boxed)
    for script, text in boxed.items():
        assert any(line in text for line in sources), f"{script} calls cap/left/step without sourcing them"
        assert "cap() {" not in text and "left() {" not in text, f"{script} defines its own time boxes"


@pytest.mark.parametrize("sweep", sorted(path.name for path in DEVICE.glob("*.yaml")))
def test_each_device_sweep_file_loads_and_its_narrowed_space_holds_configs(sweep):
    """A sweep file the GPU machine runs: its fields are known, its problems parse, and on an H200 every
    problem's space narrowed by its `space:` keeps valid configs (a mistyped field or value would leave
    none, or fail here rather than on the device)."""
    from moetune.kernels import registry
    from moetune.tuner.plan import parse_problem
    from moetune.tuner.spec import load_sweep_file
    from moetune_lab.bench.decode_compile_report import H200

    spec, _ = load_sweep_file(str(DEVICE / sweep))
    backend = registry.get(spec.backend)
    for text in spec.problems:
        problem = parse_problem(text).problem
        valid, _ = backend.search_space(problem, H200).restricted(spec.space).enumerate(problem, H200)
        assert valid, f"{sweep}: no valid config for {text}"
