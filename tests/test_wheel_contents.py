"""A built wheel of moetune holds the product and only the product: the kernels, tuner, database, service,
integrations, command line and shipped configs under `moetune/`, and nothing of the lab next door (its
benchmarks, the benchmark model, the measured baselines)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _source_tree(into: Path) -> Path:
    """The checkout's files as git sees them (tracked, and untracked but not ignored), copied: a build in
    the checkout itself would reuse its build/ folder, where files of deleted modules linger."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


def test_the_wheel_holds_the_product_and_no_lab_code(tmp_path):
    source = _source_tree(tmp_path / "src")
    # No build isolation: setuptools and wheel come from the dev extra, so no index is needed.
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            ".",
        ],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    (wheel,) = tmp_path.glob("moetune-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packages = {name.split("/")[1] for name in names if name.startswith("moetune/") and name.count("/") > 1}
    # A backend's space and cost model live in its folder, kernels/backends/<name>/.
    assert packages == {"kernels", "tuner", "db", "service", "integrations", "configs", "cli"}
    assert {name.split("/")[0] for name in names} <= {"moetune", wheel.name.split("-py3")[0] + ".dist-info"}
    assert not [n for n in names if "moetune_lab" in n or "benchmark" in n or n.endswith("mixtral.py")]
    assert "moetune/kernels/api.py" in names and "moetune/configs/tuned/nvidia_h200__mosaic_gpu.json" in names
    # The cost model's calibration is package data beside the code that reads it.
    assert "moetune/kernels/backends/mosaic_gpu/calibration/nvidia_h200.json" in names
