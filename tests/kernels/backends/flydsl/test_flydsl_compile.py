"""Real compiles: the FlyDSL kernel for gfx942 and gfx950 on Mixtral shapes, pruning, dedupe, and a
compile-only sweep stored as trials. Needs the FlyDSL toolchain (scripts/setup-flydsl.sh); no GPU.

The kernel's numerical correctness is NOT checked here (no AMD GPU on these machines): these tests
prove that it compiles, links and declares the resources and arguments the host expects.
"""

from __future__ import annotations

import json
import os

import pytest

from moetune.kernels.backends.flydsl import BACKEND
from moetune.kernels.backends.flydsl.compile import (
    OK,
    PRUNED,
    CompilerProcess,
    SweepEntry,
    compile_one,
    compile_sweep,
    plan_for,
)
from moetune.kernels.backends.flydsl.compile import prune_reason as compile_prune_reason
from moetune.kernels.backends.flydsl.config import FlyDSLConfig
from moetune.kernels.problem import Problem

GATE_UP = Problem("grouped_matmul", 4096, 4096, 28672, 8)
DOWN = Problem("grouped_matmul", 4096, 14336, 4096, 8)
CONFIGS = [
    FlyDSLConfig(),  # 128x128x64, 2x2 waves, double-buffered LDS
    FlyDSLConfig(
        tile_m=64, tile_n=128, tile_k=64, k_waves=2, lds_stages=1, xcd_swizzle=8, tile_order="n_major"
    ),
]


def report(name, entries):
    """Compile seconds per config, printed (pytest -s) and appended to $MOETUNE_FLYDSL_REPORT if set."""
    rows = [{"test": name, **e.to_dict()} for e in entries]
    for row in rows:
        print(json.dumps({k: row[k] for k in ("test", "status", "compile_s", "wall_s", "binary_hash")}))
    path = os.environ.get("MOETUNE_FLYDSL_REPORT")
    if path:
        with open(path, "a") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_mixtral_compiles_for_both_archs(toolchain_in_use, arch):
    # One worker process serves all four compiles (gate_up and down, two configs each).
    with CompilerProcess(arch) as process:
        results = {
            (name, i): compile_one(problem, config, arch, process=process)
            for name, problem in (("gate_up", GATE_UP), ("down", DOWN))
            for i, config in enumerate(CONFIGS)
        }
    report(f"mixtral-{arch}", [SweepEntry(CONFIGS[i], OK, result=r) for (_, i), r in results.items()])
    for (name, i), result in results.items():
        plan = plan_for(GATE_UP if name == "gate_up" else DOWN, CONFIGS[i], arch)
        assert result.metrics.arch == arch
        assert result.metrics.name == result.kernel_name
        assert compile_prune_reason(result, CONFIGS[i]) is None
        # The host launches with four pointers and no dynamic LDS: the code object must agree.
        assert [(a.offset, a.size, a.value_kind) for a in result.metrics.args] == [
            (8 * i, 8, "global_buffer") for i in range(4)
        ]
        assert result.metrics.lds_bytes == plan.lds_bytes
        assert result.metrics.max_workgroup_size == plan.threads
        assert result.compile_s > 0 and os.path.exists(result.hsaco_path)
    assert len({r.binary_hash for r in results.values()}) == 4


@pytest.mark.slow  # a sweep's compiles: tens of seconds
def test_sweep_prunes_spills_and_lds_overflow_and_dedupes_binaries(toolchain_in_use):
    configs = [
        FlyDSLConfig(),
        FlyDSLConfig(),  # the same kernel again: one binary, timed once
        FlyDSLConfig(tile_m=256, tile_n=256),  # fits gfx950's LDS but its accumulators spill
        FlyDSLConfig(tile_m=256, tile_n=256, tile_k=128),  # 256 KiB of LDS: pruned before compiling
    ]
    entries = compile_sweep(GATE_UP, "gfx950", configs, workers=2)
    report("prune-dedupe-gfx950", entries)
    assert [e.status for e in entries] == [OK, OK, PRUNED, PRUNED]
    assert entries[1].duplicate_of == 0 and entries[1].result.binary_hash == entries[0].result.binary_hash
    assert [e.needs_timing for e in entries] == [True, False, False, False]
    assert "spills" in entries[2].reason and entries[2].result.metrics.vgpr_spill_count > 0
    assert "LDS 262144 bytes > 163840 on gfx950" in entries[3].reason and entries[3].result is None


def test_backend_compile_only_hook(toolchain_in_use):
    static = BACKEND.compile_only(DOWN, FlyDSLConfig(tile_m=64, lds_stages=1), "gfx942")
    assert static.pruned is None and len(static.binary_hash) == 64
    assert static.metrics["vgpr_count"] > 0 and static.compile_s > 0


@pytest.mark.parametrize(("arch", "dtype"), [("gfx942", "float8_e4m3fnuz"), ("gfx950", "float8_e4m3fn")])
def test_fp8_operands_compile_with_the_archs_own_e4m3(toolchain_in_use, arch, dtype):
    """The FP8 op under per-tensor scales (the GEMM flydsl's FP8 kernel computes), compile-only."""
    problem = Problem("grouped_matmul_fp8", 4096, 4096, 28672, 8, dtype, dtype, "bfloat16", True, "tensor")
    static = BACKEND.compile_only(problem, FlyDSLConfig(tile_k=128), arch)
    assert static.pruned is None and static.metrics["target"].endswith(arch)
    assert static.metrics["vgpr_spill_count"] == 0
    heuristic = BACKEND.heuristic(problem, BACKEND.target_device(arch))
    assert not plan_for(problem, heuristic, arch).violations()


@pytest.mark.slow  # a sweep's compiles: tens of seconds
def test_compile_only_sweep_stores_binary_facts_as_trial_details(toolchain_in_use, tmp_path):
    """`moetune tune --backend flydsl --compile-only --arch gfx942`, in-process: trials are recorded
    under the arch's stand-in device with the binary's facts as details and no routing."""
    from moetune.db.store import open_store
    from moetune.kernels.device import current_fingerprint
    from moetune.tuner.candidate import CandidateRunner
    from moetune.tuner.driver import SweepDriver
    from moetune.tuner.executors import InlineExecutor
    from moetune.tuner.plan import PlannedProblem
    from moetune.tuner.spec import SweepSpec
    from moetune.tuner.sweep_setup import resolve_target

    spec = SweepSpec(backend="flydsl", compile_only=True, arch="gfx942", budget=3)
    backend, device, target = resolve_target(spec, current_fingerprint())
    assert (backend, device, target) == (BACKEND, BACKEND.target_device("gfx942"), "gfx942")
    with open_store(f"sqlite:///{tmp_path / 'moetune.db'}") as store:
        sweep_id = store.create_sweep(backend="flydsl", strategy="grid", spec={}, host="h", user="u")
        executor = InlineExecutor(CandidateRunner("w").evaluate, current_fingerprint())
        driver = SweepDriver(
            store, executor, spec, backend="flydsl", compile_target=target, device=device, poll_s=0
        )
        driver.run([PlannedProblem(DOWN, "down")], sweep_id=sweep_id)
        rows = store.trials(sweep_id=sweep_id)
    assert len(rows) == 3 and {r.status for r in rows} <= {OK, PRUNED}
    assert {(r.device_kind, r.backend) for r in rows} == {("AMD gfx942 (compile-only)", "flydsl")}
    assert all(r.routing is None and r.median_s is None and r.compile_s > 0 for r in rows)
    for row in rows:
        assert row.details["target"] == "gfx942" and len(row.details["binary_hash"]) == 64
        assert row.details["metrics"]["vgpr_count"] > 0 and "lds_bytes" in row.details["metrics"]
