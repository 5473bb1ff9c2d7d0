"""decode_compile_report.py: the main loop's straight path read from SASS, the block's Triton kernels taken
from its lowering on a CPU, and (where the triton package is installed) the compiler's report."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import types
from pathlib import Path

import pytest

from moetune.kernels.backends.mosaic_gpu import cost_model_decode, space_decode
from moetune.kernels.backends.mosaic_gpu.kernel_decode import DecodeBlockConfig
from moetune_lab.bench import decode_compile_report as report
from moetune_lab.bench import dev_shapes

SCRIPT = Path(report.__file__)
SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_2:
        /*0010*/                   LDGSTS.E.BYPASS.128 [R2], desc[UR4][R4.64] ;
        /*0020*/                   HMMA.16816.F32.BF16 R8, R12, R14, R8 ;
        /*0030*/                   HMMA.16816.F32.BF16 R16, R12, R18, R16 ;
        /*0040*/              @P1   BRA `(.L_x_1) ;
        /*0050*/                   MUFU.EX2 R20, R20 ;
        /*0060*/                   STG.E.U16 desc[UR4][R6.64], R20 ;
.L_x_1:
        /*0070*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0080*/              @P2   BRA `(.L_x_2) ;
        /*0090*/                   EXIT ;
"""


def test_the_step_is_the_loop_s_path_past_its_branch():
    step = report.main_loop(SASS)
    assert step.instructions == 6  # LDGSTS, 2 HMMA, the branch, BAR, the back edge
    assert step.branch_instructions == 2  # MUFU and STG, at a unit's last step only
    assert step.opcodes == {"HMMA": 2, "LDGSTS": 1, "BAR": 1}
    assert report.main_loop(SASS.replace("@P2   BRA `(.L_x_2)", "NOP")) is None


def test_the_prologue_is_what_runs_before_the_first_dot():
    routing = "        /*0008*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;\n"
    sass = SASS.replace(".L_x_2:\n", routing + ".L_x_2:\n")
    assert report.prologue(sass) == report.Prologue(instructions=3, barriers=1)  # MOV, BAR, LDGSTS
    assert report.prologue(SASS) == report.Prologue(instructions=2, barriers=0)
    assert report.prologue(SASS.replace("HMMA", "FFMA")) is None


def test_the_block_s_triton_kernels_come_from_its_lowering_on_a_cpu():
    problem = report.block_problem(dev_shapes.MODELS["qwen3-30b-a3b"], 8)
    # down_split > 1: the split partials meet behind a barrier, which jaxlib prints in generic form.
    config = DecodeBlockConfig(block_f=64, warps_up=8, stages_up=3, warps_down=4, stages_down=2, down_split=2)
    kernels = report.triton_kernels(problem, config, report.H200)
    assert {name: params[1:] for name, params in kernels.items()} == {
        "moetune_decode_up": (8, 3),
        "moetune_decode_down": (4, 2),
    }
    text = report.ir_text(kernels["moetune_decode_down"][0])
    assert "tt.func public @moetune_decode_down" in text
    assert '"gpu.barrier"' not in text and "gpu.barrier" in text


def test_the_fp8_block_lowers_with_its_scales():
    problem = report.block_problem(dev_shapes.MODELS["qwen3-30b-a3b"], 1, fp8="row_channel")
    assert (problem.op, problem.rhs_dtype, problem.transpose_rhs) == (
        "moe_decode_block_fp8",
        "float8_e4m3fn",
        True,
    )
    kernels = report.triton_kernels(problem, DecodeBlockConfig(), report.H200)
    assert sorted(kernels) == ["moetune_decode_down", "moetune_decode_up"]
    assert (
        report.step_bytes(problem, DecodeBlockConfig().decode_config(), 1) == 2 * 128 * 32
    )  # a byte a value


def test_the_compiler_reports_kernel_1_s_step():
    pytest.importorskip("triton", reason="the compiler report needs the triton package")
    problem = report.block_problem(dev_shapes.MODELS["qwen3-30b-a3b"], 8)
    config = DecodeBlockConfig(block_f=64, block_k=128, up_programs=128)
    up, down = report.report(problem, config)
    assert (up["kernel"], down["kernel"]) == ("moetune_decode_up", "moetune_decode_down")
    assert up["step_bytes"] == 2 * 128 * 64 * 2 and down["step_bytes"] == 128 * 64 * 2
    # Each step multiplies the gate and up tiles; storing a unit's rows waits in the branch.
    assert up["step_opcodes"]["HMMA"] > 0 and "STG" not in up["step_opcodes"]
    assert up["branch_instructions"] > 0
    schedulers = cost_model_decode.SCHEDULERS_PER_SM
    assert up["step_issue_clocks"] == up["step_instructions"] * up["warps"] / schedulers


def test_a_row_per_warp_takes_most_barriers_out_of_kernel_1_s_routing():
    pytest.importorskip("triton", reason="the compiler report needs the triton package")
    problem = report.block_problem(dev_shapes.MODELS["qwen3-30b-a3b"], 1)
    own = DecodeBlockConfig(block_f=64, block_k=256, warps_up=4)  # argmax rounds on one row
    rows = [report.report(problem, c)[0] for c in (own, dataclasses.replace(own, route_warp_rows=True))]
    # The routing's reductions over 128 experts stay in a warp: fewer than half the barriers, at
    # about as many instructions (59 and 20 barriers, 1090 and 1123 instructions with Triton 3.6).
    assert 2 * rows[1]["prologue_barriers"] < rows[0]["prologue_barriers"]
    assert rows[1]["prologue_instructions"] < 1.2 * rows[0]["prologue_instructions"]


def test_an_unknown_model_is_one_line_and_exit_2():
    run = subprocess.run(
        [sys.executable, SCRIPT, "--models", "no-such-model"], capture_output=True, text=True
    )
    assert run.returncode == 2
    message = run.stderr.strip()
    assert message.count("\n") == 0 and "no-such-model" in message


def test_sampled_configs_are_distinct_valid_fused_points_with_the_fixed_fields():
    problem = report.block_problem(dev_shapes.MODELS["qwen3-30b-a3b"], 8, k_major=True)
    assert problem.transpose_rhs
    space = space_decode.space(problem, report.H200)
    configs = report.sampled_configs(problem, 6, seed=1, fixed={"warps_up": 8})
    assert len(configs) == len(set(configs)) == 6
    for config in configs:
        assert config.fused and config.warps_up == 8
        assert space.violation(problem, config, report.H200) is None
    assert report.sampled_configs(problem, 6, seed=1, fixed={"warps_up": 8}) == configs  # seeded
    assert report.sampled_configs(problem, 6, seed=2, fixed={"warps_up": 8}) != configs


def test_a_config_that_does_not_compile_is_one_line_and_exit_1(monkeypatch, capsys):
    # The compile itself fails here, so the triton package need only import.
    monkeypatch.setitem(sys.modules, "triton", types.ModuleType("triton"))

    def fails(problem, config, device=report.H200):
        raise RuntimeError("ptxas: no")

    monkeypatch.setattr(report, "report", fails)
    argv = ["decode_compile_report.py", "--models", "qwen3-30b-a3b", "--tokens", "1", "--sample", "2"]
    monkeypatch.setattr(sys, "argv", argv)
    assert report.main() == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" ")[0] for line in lines[:2]] == ["FAILED", "FAILED"]
    assert "RuntimeError: ptxas: no" in lines[0] and lines[-1] == "0 configs compiled, 2 failed"


def test_a_negative_sample_is_one_line_and_exit_2():
    run = subprocess.run([sys.executable, SCRIPT, "--sample", "-1"], capture_output=True, text=True)
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and "--sample -1" in run.stderr
