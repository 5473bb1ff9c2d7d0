"""compile_one / compile_sweep without FlyDSL: a stand-in worker answers like the real one.

Covers what does not need the compiler: the worker protocol, crash and error mapping, content-addressed
storage, static pruning, dedupe by hash and parallel workers. test_flydsl_compile.py runs the real thing.
"""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest

from moetune.kernels.backends.flydsl import compile as flycompile
from moetune.kernels.backends.flydsl import toolchain
from moetune.kernels.backends.flydsl.config import FlyDSLConfig
from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.problem import Problem

PROBLEM = Problem("grouped_matmul", 4096, 4096, 28672, 8)
HERE = Path(__file__).parent

FAKE_WORKER = textwrap.dedent(
    f"""
    import json, sys
    sys.path.insert(0, {str(HERE)!r})
    from code_objects import code_object, kernel

    def answer(request):
        config = request["config"]
        if config["tile_m"] == 16:
            sys.exit("worker died")  # no answer at all: a crash
        if config["tile_m"] == 32:
            return {{"ok": False, "kind": "compile_error", "error": "LLVM ERROR: no registers"}}
        overrides = {{".vgpr_count": config["tile_n"], ".max_flat_workgroup_size": 256}}
        if config["waves_per_eu"] == 2:
            overrides[".vgpr_spill_count"] = 4
        target = "amdgcn-amd-amdhsa--" + request["arch"]
        open(request["out"], "wb").write(code_object(kernel(**overrides), target=target))
        return {{"ok": True, "kernel_name": "moetune_flydsl_gmm_0", "seconds": 0.5, "flydsl_version": "0"}}

    for line in sys.stdin:
        print(json.dumps(answer(json.loads(line))), flush=True)
    """
)


@pytest.fixture
def fake_worker(tmp_path, monkeypatch, flydsl_cache):
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    monkeypatch.setattr(flycompile, "WORKER", script)
    tools = toolchain.Toolchain(sys.executable, "0.5.0", "/usr/bin/ld.lld-19", "LLD 19", str(tmp_path))
    monkeypatch.setattr(toolchain, "toolchain", lambda: tools)
    return script


def test_compile_one_stores_the_code_object_by_hash(fake_worker, flydsl_cache):
    result = flycompile.compile_one(PROBLEM, FlyDSLConfig(), "gfx942")
    assert Path(result.hsaco_path) == flydsl_cache / f"{result.binary_hash}.hsaco"
    assert result.metrics.vgpr_count == 128 and result.grid == ((32 + 8) * 224, 1, 1)
    assert result.compile_s == 0.5 and result.wall_s > 0
    assert not list(flydsl_cache.glob(".compile-*"))  # the scratch file is gone


def test_errors_map_by_type(fake_worker):
    with pytest.raises(flycompile.CompileFailed, match="exited with status 1 and no result: worker died"):
        flycompile.compile_one(PROBLEM, FlyDSLConfig(tile_m=16, waves_m=1), "gfx942")
    with pytest.raises(flycompile.CompileFailed, match="LLVM ERROR"):
        flycompile.compile_one(PROBLEM, FlyDSLConfig(tile_m=32, waves_m=2), "gfx942")
    with pytest.raises(ConfigInvalid, match="LDS 131072 bytes"):
        flycompile.compile_one(PROBLEM, FlyDSLConfig(tile_m=256, tile_n=256), "gfx942")
    with pytest.raises(ConfigInvalid, match="arch='gfx90a'"):
        flycompile.compile_one(PROBLEM, FlyDSLConfig(), "gfx90a")


def test_a_crash_quotes_the_worker_s_last_words_even_when_its_stderr_is_read_late(fake_worker, monkeypatch):
    # The stderr reader is a thread: the crash must wait for it, not race it (CI once lost that race).
    drain = flycompile._drain

    def late_drain(stream, tail):
        time.sleep(0.5)
        drain(stream, tail)

    monkeypatch.setattr(flycompile, "_drain", late_drain)
    with pytest.raises(flycompile.CompileFailed, match="no result: worker died"):
        flycompile.compile_one(PROBLEM, FlyDSLConfig(tile_m=16, waves_m=1), "gfx942")


def test_a_worker_process_serves_many_requests_and_is_replaced_after_a_crash(fake_worker):
    with flycompile.CompilerProcess("gfx942") as process:
        first = flycompile.compile_one(PROBLEM, FlyDSLConfig(), "gfx942", process=process)
        pid = process._proc.pid
        flycompile.compile_one(PROBLEM, FlyDSLConfig(tile_n=64), "gfx942", process=process)
        assert process._proc.pid == pid
        with pytest.raises(flycompile.CompileFailed, match="worker died"):
            flycompile.compile_one(PROBLEM, FlyDSLConfig(tile_m=16, waves_m=1), "gfx942", process=process)
        again = flycompile.compile_one(PROBLEM, FlyDSLConfig(), "gfx942", process=process)
        assert process._proc.pid != pid and again.binary_hash == first.binary_hash
        with pytest.raises(ValueError, match="for gfx942 cannot compile for gfx950"):
            flycompile.compile_one(PROBLEM, FlyDSLConfig(), "gfx950", process=process)


def test_sweep_statuses_dedupe_and_order(fake_worker):
    configs = [
        FlyDSLConfig(),  # ok
        FlyDSLConfig(xcd_swizzle=8),  # same fake binary as the first: duplicate
        FlyDSLConfig(tile_n=256, lds_stages=1, waves_per_eu=2),  # compiles, spills: pruned from metadata
        FlyDSLConfig(tile_m=32, waves_m=2),  # compile error
        FlyDSLConfig(tile_m=256, tile_n=256),  # plan rejects it: pruned without compiling
        FlyDSLConfig(tile_n=64),  # ok, a different binary
    ]
    entries = flycompile.compile_sweep(PROBLEM, "gfx942", configs, workers=3)
    assert [e.config for e in entries] == configs
    assert [e.status for e in entries] == ["ok", "ok", "pruned", "compile_error", "pruned", "ok"]
    assert [e.duplicate_of for e in entries] == [None, 0, None, None, None, None]
    assert [e.needs_timing for e in entries] == [True, False, False, False, False, True]
    assert "spills: 4 VGPRs" in entries[2].reason
    assert "LLVM ERROR" in entries[3].reason
    row = entries[0].to_dict()
    assert row["metrics"]["vgpr_count"] == 128 and "args" not in row["metrics"]


def test_a_missing_toolchain_stops_the_sweep_before_it_starts(monkeypatch, flydsl_cache):
    def missing():
        raise toolchain.ToolchainMissing("no FlyDSL interpreter; run scripts/setup-flydsl.sh")

    monkeypatch.setattr(toolchain, "toolchain", missing)
    with pytest.raises(toolchain.ToolchainMissing, match="setup-flydsl"):
        flycompile.compile_sweep(PROBLEM, "gfx942", [FlyDSLConfig()])
