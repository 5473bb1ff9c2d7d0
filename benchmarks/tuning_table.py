"""What tuning bought, per Mixtral-8x7B problem, as a Markdown table: the sweep's winner against the
backend's heuristic default (both from one sweep's `moetune tune --json` outcome), XLA's ragged_dot (from
the first of the --xla outcomes that timed it: sweeps with their baselines), and the shipped pack's entry.

    python3 benchmarks/tuning_table.py one_gpu.json --xla check.json sweep.json --pack configs/tuned/x.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from moetune.kernels import packs


def _ms(value: str) -> float | None:
    return None if value in ("", "-", None) else float(value)


# The pack's problems of each Mixtral-8x7B GEMM: (op, k); m is T * top_k.
MIXTRAL_GEMMS = {"gate_up": ("grouped_matmul_swiglu", 4096), "down": ("grouped_matmul", 14336)}


def _trial_count(text: str) -> int:
    """All trials of a summary's "16 ok, 1 wrong_result"; 0 for ""."""
    return sum(int(part.split()[0]) for part in text.split(",") if part.strip())


def _label_key(label: str) -> tuple[str, int]:
    """("gate_up", 4096) from "mixtral-8x7b gate_up T=4096"."""
    *_, gemm, tokens = label.split()
    return gemm, int(tokens.removeprefix("T="))


def table(sweep: dict, xla_runs: list[dict], pack: packs.Pack, top_k: int) -> list[str]:
    xla: dict[tuple[str, int], tuple[float, int]] = {}
    for index, run in enumerate(xla_runs):
        for row in run["problems"]:
            key, value = _label_key(row["problem"]), _ms(row.get("xla_ms"))
            if value is not None and key not in xla:
                xla[key] = (value, index)
    shipped = {(e.problem.k, e.problem.m, e.problem.op): e.median_s for e in pack.entries}
    lines = [
        "| GEMM | T | trials | winner | heuristic | XLA ragged_dot | vs heuristic | vs XLA | shipped pack |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in sweep["problems"]:
        gemm, tokens = _label_key(row["problem"])
        winner, heuristic = _ms(row["winner_ms"]), _ms(row["heuristic_ms"])
        xla_ms, source = xla.get((gemm, tokens), (None, None))
        op, k = MIXTRAL_GEMMS[gemm]
        pack_s = shipped.get((k, tokens * top_k, op))
        cells = [
            "gate_up+SwiGLU" if gemm == "gate_up" else gemm,
            str(tokens),
            str(_trial_count(row["trials"])),
            f"{winner:.4g}" if winner else "-",
            f"{heuristic:.4g}" if heuristic else "-",
            f"{xla_ms:.4g}" + ("*" * source) if xla_ms else "-",
            f"{heuristic / winner:.2f}x" if winner and heuristic else "-",
            f"{xla_ms / winner:.2f}x" if winner and xla_ms else "-",
            f"{pack_s * 1e3:.4g}" if pack_s else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path, help="`moetune tune --json` outcome of the sweep")
    parser.add_argument("--xla", type=Path, nargs="*", default=[], help="outcomes with xla_ms (first wins)")
    parser.add_argument("--pack", type=Path, required=True)
    parser.add_argument("--top-k", type=int, default=2, help="rows per token (m = T * top_k)")
    args = parser.parse_args()
    sweep = json.loads(args.sweep.read_text())
    xla_runs = [json.loads(p.read_text()) for p in args.xla]
    print("\n".join(table(sweep, xla_runs, packs.load(args.pack), args.top_k)))


if __name__ == "__main__":
    main()
