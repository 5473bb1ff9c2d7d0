"""lab/device/e2e.sh rehearsed on the CPU (the xla backend, the tiny model): the plumbing a device call
depends on, so that a broken flag costs a CI run rather than minutes of GPU time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest  # noqa: E402

pytestmark = pytest.mark.slow  # three runs of the script: minutes on two cores

ROOT = Path(__file__).resolve().parents[3]  # the repository: the script runs from its root
SHIPPED = ROOT / "configs" / "tuned" / "nvidia_h200__mosaic_gpu.json"


def _e2e(env: dict) -> tuple[int, str]:
    """Run the script with this environment: its exit status and its output (stdout, then stderr)."""
    run = subprocess.run(
        ["bash", "lab/device/e2e.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    return run.returncode, run.stdout + run.stderr


def test_a_sweep_after_a_pack_import_reports_and_exports_its_own_sweep(tmp_path):
    out = tmp_path / "out"
    extra = tmp_path / "extra.yaml"  # a shape the tiny model's sweep does not tune
    extra.write_text("problems:\n  - m=8,k=128,n=256,g=4,dtype=bf16\nstrategy: tpe\ntimeout_s: 120\n")
    env = os.environ | {
        "OUT": str(out),
        # the scripts call python3: the one running the tests, with moetune, Ray and Optuna installed
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "E2E_MODEL": "tiny",
        "E2E_BUCKETS": "1,64",
        "E2E_BACKEND": "xla",
        "E2E_GPU": "cpu",
        "E2E_BUDGET": "3",
        "E2E_WORKERS": "2",
        "E2E_SWEEP_S": "120",
        "E2E_SKIP_GPU_TESTS": "1",
        "E2E_SKIP_GRID": "1",
        "E2E_SKIP_RESUME": "1",
        "E2E_IMPORT_PACK": str(SHIPPED),
        "E2E_EXTRA_SWEEP": str(extra),
        "E2E_EXTRA_BUDGET": "2",
    }
    rc, log = _e2e(env)
    assert rc == 0, log[-4000:]
    shipped = len(json.loads(SHIPPED.read_text())["entries"])
    assert f"imported {shipped} winners for NVIDIA H200 / mosaic_gpu" in log
    assert "sweep rc=0" in log and "extra sweep rc=0" in log, log[-4000:]
    pack = json.loads((out / "pack.json").read_text())
    # gate_up and down of T=1 and 64, and the extra sweep's one shape
    assert pack["backend"] == "xla" and len(pack["entries"]) == 5
    assert any(e["problem"]["m"] == 8 and e["problem"]["k"] == 128 for e in pack["entries"])
    assert (out / "report.html").stat().st_size > 0
    with tarfile.open(out / "logs.tgz") as bundle:
        sweep = json.loads(bundle.extractfile("./sweep.json").read())
        trials = json.loads(bundle.extractfile("./trials.json").read())
        timeline = bundle.extractfile("./timeline.log").read().decode()
    assert sweep["sweep_id"] == 2 and sweep["status"] == "done"
    # trials.json and the timeline are the tuning sweep's (xla trials), not the import's 38 winners
    assert {(t["sweep_id"], t["backend"]) for t in trials} == {(2, "xla")} and len(trials) >= 4
    assert timeline.startswith(f"{len(trials)} trials of 4 problems")

    # Resuming that database's tuning sweep (id 2, after the import) repeats no finished trial.
    again = {k: v for k, v in env.items() if not k.startswith("E2E_EXTRA")} | {
        "OUT": str(tmp_path / "again"),
        "E2E_RESUME_DB": str(out / "sweep.db"),
        "E2E_RESUME_SWEEP": "2",
    }
    rc, log = _e2e(again)
    assert rc == 0 and "resume sweep 2 of" in log and "resumed sweep rc=0" in log, log[-4000:]
    with tarfile.open(tmp_path / "again" / "logs.tgz") as bundle:
        before = json.loads(bundle.extractfile("./trials-before-resume.json").read())
        after = json.loads(bundle.extractfile("./trials.json").read())
    assert len(before) == len(trials) and sorted(t["id"] for t in after) == sorted(t["id"] for t in trials)

    # After a kernel change: the pack imported as of another kernel source, one bucket swept in full, and
    # E2E_STALE_BUDGET re-tunes the rest, so the export holds every problem on the current source.
    stale = pack | {"kernel_source_hash": "0" * 16}
    (tmp_path / "stale.json").write_text(json.dumps(stale))
    changed = {k: v for k, v in env.items() if not k.startswith("E2E_EXTRA")} | {
        "OUT": str(tmp_path / "changed"),
        "E2E_IMPORT_PACK": str(tmp_path / "stale.json"),
        "E2E_BUCKETS": "1",
        "E2E_STALE_BUDGET": "1",
    }
    rc, log = _e2e(changed)
    assert rc == 0 and "imported 5 winners" in log and "stale sweep rc=0" in log, log[-4000:]
    refreshed = json.loads((tmp_path / "changed" / "pack.json").read_text())
    assert refreshed["kernel_source_hash"] == pack["kernel_source_hash"]
    keys = lambda p: sorted(json.dumps(e["problem"], sort_keys=True) for e in p["entries"])  # noqa: E731
    assert keys(refreshed) == keys(pack)  # T=1 from the sweep, T=64 and the extra shape from the stale pass
