"""The decode cost model's register count of kernel 2 (cost_model_decode.DOWN_*_REGISTERS), refitted from
the compiler on a CPU: kernel 2 of Qwen3-30B-A3B's block compiled for sm_90a (decode_compile_report.py:
the mosaic_gpu backend's lowering, the `triton` package's compiler and ptxas) over a grid of its tiles,
warps, widenings and token counts, and ptxas's registers a thread fitted by least squares on the values
of the [rows, block_h] accumulator and of the [block_fd, block_h] weight tile a thread holds. Configs at
the ceiling (250 registers and up) are left out of the fit (their count is the cap, not the need) and
printed beside the fit's estimate, with their spilled bytes.

    python3 lab/bench/decode_register_fit.py [--json OUT]

About two minutes on two cores (126 compiles). Needs the triton package (pip install triton).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from moetune.kernels.backends.mosaic_gpu import cost_model_decode, space_decode
from moetune_lab.bench import decode_compile_report as report
from moetune_lab.bench import dev_shapes

SIDES = (64, 128, 256)  # block_h and block_fd
WARPS = (4, 8)
STAGES = 3  # kernel 2's pipeline depth, the same at every point (it moves shared memory, not registers)
# (tokens, FP8 scale layout or None for 16-bit weights, the widenings compiled)
CASES = ((32, "row_channel", ("convert", "bits", "f16")), (8, "row_channel", ("convert", "bits", "f16")))
CASES += ((32, None, ("convert",)),)
CEILING = 250


def features(tokens: int, block_h: int, block_fd: int, warps: int) -> tuple[float, float, float]:
    """(1, accumulator values, weight-tile values) a thread of kernel 2 holds, as the model counts them
    (cost_model_decode.down_thread_values)."""
    rows = max(cost_model_decode.DOT_ROWS, tokens)
    return 1.0, *cost_model_decode.down_thread_values(rows, block_h, block_fd, warps)


def compile_grid() -> list[dict]:
    """ptxas's registers and spilled bytes of kernel 2 at every point of the grid."""
    out = []
    model = dev_shapes.MODELS["qwen3-30b-a3b"]
    for tokens, layout, modes in CASES:
        problem = report.block_problem(model, tokens, layout)
        base = space_decode.portable(problem)  # kernel 1's fields: any that fit
        for mode, block_h, block_fd, warps in itertools.product(modes, SIDES, SIDES, WARPS):
            config = dataclasses.replace(
                base, widen_down=mode, block_h=block_h, block_fd=block_fd, warps_down=warps, down_split=1,
                stages_down=STAGES,
            )  # fmt: skip
            bytecode, num_warps, stages = report.triton_kernels(problem, config, report.H200)[
                "moetune_decode_down"
            ]
            with tempfile.TemporaryDirectory() as workdir:
                compiled = report.compile_sm90(report.ir_text(bytecode), num_warps, stages, Path(workdir))
            out.append(
                {"tokens": tokens, "fp8": layout, "widen": mode, "block_h": block_h, "block_fd": block_fd,
                 "warps": warps, "registers": compiled.registers, "spill_bytes": compiled.spill_bytes}
            )  # fmt: skip
            print(json.dumps(out[-1]), flush=True)
    return out


def fit(rows: list[dict]) -> tuple[np.ndarray, float, float]:
    """(base, per accumulator value, per tile value), and the rms and largest error in registers, over the
    rows below the ceiling."""
    below = [r for r in rows if r["registers"] < CEILING]
    x = np.array([features(r["tokens"], r["block_h"], r["block_fd"], r["warps"]) for r in below])
    y = np.array([r["registers"] for r in below], dtype=float)
    coefficients, *_ = np.linalg.lstsq(x, y, rcond=None)
    error = x @ coefficients - y
    return coefficients, float(np.sqrt(np.mean(error**2))), float(np.max(np.abs(error)))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path, help="write the compiled grid and the fit here")
    args = parser.parse_args()
    try:
        import triton  # noqa: F401
    except ImportError:
        print("decode_register_fit: needs the triton package (pip install triton)", file=sys.stderr)
        return 2
    rows = compile_grid()
    coefficients, rms, largest = fit(rows)
    below = sum(r["registers"] < CEILING for r in rows)
    print(
        f"registers ~ {coefficients[0]:.1f} + {coefficients[1]:.3f} x accumulator values + "
        f"{coefficients[2]:.3f} x tile values a thread ({below} of {len(rows)} configs below {CEILING}; "
        f"{rms:.0f} registers rms, {largest:.0f} at most)"
    )
    for r in rows:
        if r["registers"] >= CEILING:
            estimate = float(
                np.dot(features(r["tokens"], r["block_h"], r["block_fd"], r["warps"]), coefficients)
            )
            print(
                f"  at the ceiling: T={r['tokens']} {r['fp8'] or 'bf16'} {r['widen']} {r['block_h']}x"
                f"{r['block_fd']} {r['warps']} warps: {r['registers']} registers, {r['spill_bytes']} B "
                f"spilled; the fit {estimate:.0f}"
            )
    if args.json:
        fitted = {"base": coefficients[0], "accumulator": coefficients[1], "tile": coefficients[2]}
        args.json.write_text(json.dumps({"rows": rows, "fit": fitted, "rms": rms}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
