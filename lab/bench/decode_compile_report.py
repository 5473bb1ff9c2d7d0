"""What the compiler makes of the fused decode block's two Triton kernels, read on a CPU: per kernel its
registers, spilled bytes and shared memory (ptxas's resource report), the instructions a warp issues
in one step of its main loop (the SASS), beside the weight bytes that step loads, and the instructions
and barriers before its first dot (kernel 1's routing and slot lookup).

An SM issues at most one instruction per clock on each of its four schedulers, so a step takes at least
instructions x warps / 4 clocks: the step's weight tile over that time is the most one program can stream
whatever the memory does. Where that falls near an SM's share of the HBM rate, the loop is issue-bound,
which no cost-model term of the bytes in flight would show (the decode cost model assumes a step is its
loads).

Each kernel is built as the mosaic_gpu backend builds it for an H200 (the op's config, Pallas's Triton
lowering for that GPU, as lab/bench/pack_lowering.py lowers packs), its Triton IR taken from the lowered
module, compiled for sm_90a by the `triton` package (pip; its ptxas and nvdisasm), not by XLA's own
Triton build that jaxlib runs on the GPU: the two differ in version, so the figures are of the same code
through a near compiler, good for comparing configs and kernel changes, not a GPU's exact registers.
A step is the main loop's path when no branch inside it is taken (kernel 1 stores a unit's rows in a
branch at its last step only); the branch's instructions are reported apart.

    python3 lab/bench/decode_compile_report.py [--models qwen3-next-80b-a3b ...] [--tokens 1 8 32]
        [--config '{"warps_up": 8}'] [--fp8 row_channel | --k-major] [--sample N [--seed S]] [--json OUT]

Without --config each shape takes the heuristic's config (space_decode.heuristic); --config replaces
fields of it. With --sample N each shape takes N configs of the block's search space instead, drawn at
random among the valid fused ones (--config then fixes those fields): what a sweep would build, compiled
before any GPU is at hand. A config that fails to lower or compile is one line (FAILED, the error) and
the exit code is 1.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import itertools
import json
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from moetune.kernels import registry
from moetune.kernels.backends.mosaic_gpu import cost_model_decode, hardware, space_decode
from moetune.kernels.backends.mosaic_gpu.kernel_decode import DecodeBlockConfig
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import ConfigInvalid, Unsupported
from moetune.kernels.moe.decode_block import DecodeConfig
from moetune.kernels.problem import Problem
from moetune.tuner.strategies.base import CandidateSpace
from moetune_lab.bench import dev_shapes
from moetune_lab.bench.pack_lowering import lowering_platform, running_on

H200 = DeviceFingerprint("NVIDIA H200", "gpu", 132, 141 << 30, "9.0", "", "cuda 13000", "0.11.2", "0.11.2")
# The block's development models (docs/decode-block.md's table).
DECODE_MODELS = ("qwen3-30b-a3b", "qwen3-next-80b-a3b", "mixtral-8x7b")
TRITON_CALL = "__gpu$xla.gpu.triton"
# nvdisasm's instruction lines ("/*0120*/  @P0 BRA `(.L_x_3) ;") and labels (".L_x_3:").
INSTRUCTION = re.compile(r"/\*([0-9a-f]+)\*/\s+(.*?)\s*;")
LABEL = re.compile(r"^\s*(\.L_x_\d+):")
TARGET = re.compile(r"BRA\S*\s+`?\(?(\.L_x_\d+)")
# The tensor-core instructions: mma.sync (HMMA), and wgmma (HGMMA) where a dot fills a warpgroup.
MMA = ("HMMA", "HGMMA")
OPCODES = tuple("HMMA HGMMA LDGSTS LDSM BAR SHFL STG MUFU F2F F2FP PRMT LOP3 HFMA2 STL LDL".split())


def block_problem(
    model: dev_shapes.Model, tokens: int, fp8: str | None = None, *, k_major: bool = False
) -> Problem:
    """The block's problem: 16-bit [E, H, 2F] weights (K-major [E, 2F, H] with `k_major`), or with `fp8`
    (a scale layout) the FP8 block's K-major float8_e4m3fn weights scaled so."""
    if fp8 is None:
        return Problem(
            "moe_decode_block", tokens, model.hidden, 2 * model.ffn, model.experts,
            "bfloat16", "bfloat16", "bfloat16", transpose_rhs=k_major, top_k=model.top_k,
        )  # fmt: skip
    return Problem(
        "moe_decode_block_fp8", tokens, model.hidden, 2 * model.ffn, model.experts,
        "bfloat16", "float8_e4m3fn", "bfloat16", transpose_rhs=True, top_k=model.top_k, scale_layout=fp8,
    )  # fmt: skip


def triton_kernels(problem: Problem, config: DecodeBlockConfig, device: DeviceFingerprint) -> dict:
    """{kernel name: (Triton IR as MLIR bytecode, num_warps, num_stages)} of the block as the mosaic_gpu
    backend builds it on `device`, lowered from this CPU."""
    backend = registry.get("mosaic_gpu")
    with running_on(device):
        kernel = backend.build(problem, config)
        traced = jax.jit(kernel).trace(*problem.spec.shape_dtypes(problem))
        module = traced.lower(lowering_platforms=(lowering_platform(device),)).compiler_ir("stablehlo")
    found: dict = {}

    def walk(operation) -> None:
        for region in operation.regions:
            for block in region.blocks:
                for op in block.operations:
                    if op.operation.name == "stablehlo.custom_call" and TRITON_CALL in str(
                        op.attributes["call_target_name"]
                    ):
                        params = op.attributes["mhlo.backend_config"]
                        found[str(params["name"]).strip('"')] = (
                            bytes(params["ir"].value_bytes),
                            _int(params["num_warps"]),
                            _int(params["num_stages"]),
                        )
                    walk(op.operation)

    walk(module.operation)
    return found


def _int(attribute: Any) -> int:
    return int(str(attribute).split(":")[0])


def ir_text(bytecode: bytes) -> str:
    """The Triton IR as text the `triton` package parses: jaxlib's Triton dialect reads the bytecode;
    gpu.barrier, whose dialect is not loaded here, prints in generic form and is written back plainly."""
    from jax._src.lib.mlir import ir
    from jax._src.lib.triton import dialect as triton_dialect

    context = ir.Context()
    triton_dialect.register_dialect(context)
    context.allow_unregistered_dialects = True
    with context:
        text = ir.Module.parse(bytecode).operation.get_asm(enable_debug_info=False)
    return re.sub(r'"gpu\.barrier"\(\) <.*?> : \(\) -> \(\)', "gpu.barrier", text)


@dataclasses.dataclass(frozen=True)
class Compiled:
    shared_bytes: int
    registers: int
    spill_bytes: int
    sass: str


def compile_sm90(text: str, warps: int, stages: int, workdir: Path) -> Compiled:
    """Triton IR text compiled for sm_90a by the `triton` package, with ptxas's report and the SASS."""
    import triton
    from triton.backends.compiler import GPUTarget

    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    source = workdir / "kernel.ttir"
    source.write_text(text)
    kernel = triton.compile(
        str(source), target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages}
    )
    ptx, cubin = workdir / "kernel.ptx", workdir / "kernel.cubin"
    ptx.write_text(kernel.asm["ptx"])
    report = subprocess.run(
        [tools / "ptxas", "-v", "--gpu-name", "sm_90a", ptx, "-o", cubin],
        capture_output=True, text=True, check=True,
    ).stderr  # fmt: skip
    sass = subprocess.run([tools / "nvdisasm", "-c", cubin], capture_output=True, text=True, check=True)
    return Compiled(
        shared_bytes=kernel.metadata.shared,
        registers=int(re.search(r"Used (\d+) registers", report).group(1)),
        spill_bytes=int(re.search(r"(\d+) bytes spill stores", report).group(1)),
        sass=sass.stdout,
    )


@dataclasses.dataclass(frozen=True)
class LoopStep:
    instructions: int  # per warp, on the path that takes no branch inside the loop
    opcodes: dict[str, int]
    branch_instructions: int  # inside the loop, on the branches a step skips


def _opcode(instruction: str) -> str:
    words = instruction.split()
    return (words[1] if words[0].startswith("@") else words[0]).split(".")[0]


def main_loop(sass: str) -> LoopStep | None:
    """The loop with the most HMMA instructions (a backward branch and its target) and its straight path:
    the instructions between a conditional forward branch inside it and that branch's target run only
    in the steps that do not jump (kernel 1's store at a unit's last step), so they count as the
    branch's, not the step's. None where the SASS has no loop."""
    instructions, labels, pending = [], {}, None
    for line in sass.splitlines():
        label = LABEL.match(line)
        if label:
            pending = label.group(1)
            continue
        found = INSTRUCTION.search(line)
        if found:
            address = int(found.group(1), 16)
            instructions.append((address, found.group(2)))
            if pending:
                labels[pending], pending = address, None
    loops = []
    for address, instruction in instructions:
        target = TARGET.search(instruction)
        if target and labels.get(target.group(1), address + 1) <= address:
            start = labels[target.group(1)]
            body = [(a, i) for a, i in instructions if start <= a <= address]
            loops.append((sum(_opcode(i) in MMA for _, i in body), body))
    if not loops:
        return None
    _, body = max(loops, key=lambda loop: loop[0])
    end = body[-1][0]
    straight, skipped, skip_to = [], [], None
    for address, instruction in body:
        if skip_to is not None and address >= skip_to:
            skip_to = None
        (skipped if skip_to is not None else straight).append(instruction)
        target = TARGET.search(instruction)
        if skip_to is None and target and instruction.startswith("@") and address < end:
            destination = labels.get(target.group(1), 0)
            if address < destination <= end:
                skip_to = destination
    counts = collections.Counter(_opcode(i) for i in straight)
    return LoopStep(len(straight), {k: counts[k] for k in OPCODES if counts[k]}, len(skipped))


@dataclasses.dataclass(frozen=True)
class Prologue:
    instructions: int  # in program order before the first HMMA (for kernel 1: its routing and more)
    barriers: int  # BAR instructions among them: exchanges between the program's warps


def prologue(sass: str) -> Prologue | None:
    """The instructions before the kernel's first HMMA in program order, where each program's routing and
    slot lookup run before its first weight tile is used (their static count: a loop among them counts
    once). None where the SASS has no HMMA."""
    before = []
    for found in INSTRUCTION.finditer(sass):
        if _opcode(found.group(2)) in MMA:
            return Prologue(len(before), sum(_opcode(i) == "BAR" for i in before))
        before.append(found.group(2))
    return None


def step_bytes(problem: Problem, config: DecodeConfig, kernel: int) -> int:
    """Weight bytes one loop step loads: kernel 1 the gate and up tiles, kernel 2 the w_down tile."""
    item = jnp.dtype(problem.rhs_dtype).itemsize
    if kernel == 1:
        return 2 * config.block_k * config.block_f * item
    return config.block_fd * config.block_h * item


def report(problem: Problem, config: DecodeBlockConfig, device: DeviceFingerprint = H200) -> list[dict]:
    """One row per kernel of the block: the compiler's figures and the issue bound of its loop's step."""
    facts = hardware.facts(device.compute_capability)
    share_bytes_per_s = hardware.hbm_bytes_per_s(device.device_kind, device.compute_capability) / (
        device.core_count
    )
    rows = []
    kernels = triton_kernels(problem, config, device)
    for index, name in enumerate(space_decode.KERNELS, start=1):  # kernel 1, then kernel 2
        bytecode, warps, stages = kernels[name]
        with tempfile.TemporaryDirectory() as workdir:
            compiled = compile_sm90(ir_text(bytecode), warps, stages, Path(workdir))
        step = main_loop(compiled.sass)
        first = prologue(compiled.sass)
        row = {
            "kernel": name,
            "warps": warps,
            "stages": stages,
            "registers": compiled.registers,
            "spill_bytes": compiled.spill_bytes,
            "shared_bytes": compiled.shared_bytes,
        }
        if first is not None:
            row |= {"prologue_instructions": first.instructions, "prologue_barriers": first.barriers}
        if step is not None:
            clocks = step.instructions * warps / cost_model_decode.SCHEDULERS_PER_SM
            tile = step_bytes(problem, config.decode_config(), index)
            rate = tile / (clocks / facts.sustained_clock_hz)
            row |= {
                "step_instructions": step.instructions,
                "step_opcodes": step.opcodes,
                "branch_instructions": step.branch_instructions,
                "step_issue_clocks": clocks,
                "step_bytes": tile,
                "issue_bound_gb_per_s": rate / 1e9,
                "issue_bound_per_hbm_share": rate / share_bytes_per_s,
            }
        rows.append(row)
    return rows


def sampled_configs(
    problem: Problem, count: int, seed: int, fixed: dict[str, Any], device: DeviceFingerprint = H200
) -> list[DecodeBlockConfig]:
    """Up to `count` distinct valid fused configs of the block's space for `problem` (its domains narrowed
    to `fixed`), drawn as a sweep's random strategy draws them; fewer where few points are valid."""
    space = space_decode.space(problem, device).restricted({"fused": True} | fixed)
    # About 1 point in 100 is valid: enough draws that `count` of them almost surely are.
    drawn = CandidateSpace(space, problem, device).sample(random.Random(seed), 5000 * count)
    return list(itertools.islice(dict.fromkeys(drawn), count))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=list(DECODE_MODELS))
    parser.add_argument("--tokens", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--config", type=json.loads, default={}, help="fields replacing the heuristic's")
    weights = parser.add_mutually_exclusive_group()
    weights.add_argument("--fp8", metavar="LAYOUT", help="the FP8 block, its weights' scales in LAYOUT")
    weights.add_argument("--k-major", action="store_true", help="16-bit K-major weights [E, 2F, H]")
    parser.add_argument("--sample", type=int, default=0, metavar="N", help="N random valid configs a shape")
    parser.add_argument("--seed", type=int, default=0, help="of --sample's draws")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    if args.sample < 0:
        print(
            f"decode_compile_report: --sample {args.sample}: a count of configs, 0 or more", file=sys.stderr
        )
        return 2
    models = dev_shapes.MODELS
    unknown = [name for name in args.models if name not in models]
    if unknown:
        known = ", ".join(sorted(models))
        print(f"decode_compile_report: unknown model {unknown[0]!r}; one of {known}", file=sys.stderr)
        return 2
    try:
        import triton  # noqa: F401
    except ImportError:
        print("decode_compile_report: needs the triton package (pip install triton)", file=sys.stderr)
        return 2
    out, compiled, failed = [], 0, 0
    for name in args.models:
        for tokens in args.tokens:
            try:
                problem = block_problem(models[name], tokens, args.fp8, k_major=args.k_major)
                space_decode.check_problem(problem)
                configs = (
                    sampled_configs(problem, args.sample, args.seed, args.config)
                    if args.sample
                    else [dataclasses.replace(space_decode.heuristic(problem, H200), **args.config)]
                )
            except (ConfigInvalid, Unsupported) as e:
                print(f"{name} T={tokens}: skipped ({e})")
                continue
            for config in configs:
                try:
                    rows = report(problem, config)
                except Exception as e:  # noqa: BLE001 - any lowering or compile error is the finding
                    failed += 1
                    print(f"FAILED {name} T={tokens} {json.dumps(config.to_dict())}: {type(e).__name__}: {e}")
                    continue
                compiled += 1
                for row in rows:
                    row |= {"model": name, "tokens": tokens, "config": config.to_dict()}
                    out.append(row)
                    print(row_line(row))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    if args.sample:
        print(f"{compiled} configs compiled, {failed} failed")
    return 1 if failed else 0


def row_line(row: dict) -> str:
    """One kernel's row as one line."""
    step = (
        f"step {row['step_instructions']} instr/warp ({row['step_issue_clocks']:.0f} issue "
        f"clocks for {row['step_bytes'] // 1024} KiB: {row['issue_bound_per_hbm_share']:.1f}x "
        f"an SM's HBM share)"
        if "step_instructions" in row
        else "no loop"
    )
    before = (
        f"; before the first dot {row['prologue_instructions']} instr/warp, "
        f"{row['prologue_barriers']} barriers"
        if "prologue_instructions" in row
        else ""
    )
    return (
        f"{row['model']} T={row['tokens']} {row['kernel']}: {row['warps']} warps, {row['registers']} "
        f"registers, {row['spill_bytes']} B spilled, {row['shared_bytes']} B shared; {step}{before}"
    )


if __name__ == "__main__":
    sys.exit(main())
