"""benchmarks/README's kernel table from bench_gemm.py outputs: one markdown row per (projection, T, routing).

Columns as the README explains them: times in ms, issue 5's three ratios (moe_shapes.target_ratios), and the
winning moetune config abbreviated (per-warpgroup block_m x block_n, block_k, stages; ws-n / ws-m / plain;
np = one CTA per tile; sk = split-K; grid order and width unless m8; "(pack)" = the shipped pack's winner).

    python3 benchmarks/gemm_table.py results/..._bench_gemm_gate_up.json results/..._bench_gemm_down.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import moe_shapes

HEADER = (
    "| proj | T | routing | moetune | torch grouped_mm | mgpu best | mgpu default | XLA ragged_dot "
    "| dense einsum | cuBLAS same FLOPs | HBM roofline | vs peer | cuBLAS | roof | moetune config |"
)
METHODS = ("moetune", "torch_grouped_mm", "mgpu_best", "mgpu_default", "xla_ragged_dot", "dense_einsum")


def config_label(config: dict) -> str:
    c = config
    label = f"{c['block_m']}x{c['block_n']}k{c['block_k']}s{c['max_concurrent_steps']}"
    label += f" ws-{c['wg_split']}" if c["warp_specialized"] else " plain"
    if not c["persistent"]:
        label += " np"
    if c["split_k"] > 1:
        label += f" sk{c['split_k']}"
    order = f"{c['grid_minor_dim']}{c['grid_tile_width']}"
    return label if order == "m8" else f"{label} {order}"


def _winner(case: dict) -> str:
    moetune = case["methods"]["moetune"]
    tried = moetune.get("tried", [])
    best = min(tried, key=lambda t: t["median_ms"]) if tried else {"config": moetune["config"]}
    return config_label(best["config"]) + (" (pack)" if best.get("from_pack") else "")


def _in_order(runs: list[dict]) -> list[dict]:
    """Every run's cases, projections and routings in the order they first appear, T ascending (runs may
    split one projection's token counts between them, in any order)."""
    cases = [case for run in runs for case in run["cases"]]
    projs = list(dict.fromkeys(c["proj"] for c in cases))
    routings = list(dict.fromkeys(c["routing"] for c in cases))
    return sorted(cases, key=lambda c: (projs.index(c["proj"]), c["tokens"], routings.index(c["routing"])))


def rows(runs: list[dict]) -> list[str]:
    lines = [HEADER, "|" + " --- |" * HEADER.count(" |")]
    for case in _in_order(runs):
        ms = {name: case["methods"].get(name, {}).get("median_ms") for name in METHODS}
        ratios = moe_shapes.target_ratios(case)
        times = " | ".join(f"{ms[name]:.3f}" if ms[name] else "-" for name in METHODS)
        cublas = case["methods"]["cublas_torch"]["median_ms"]
        lines.append(
            f"| {case['proj']} | {case['tokens']} | {case['routing']} | {times} | {cublas:.3f} "
            f"| {case['hbm_roofline_ms']:.3f} | {ratios['vs_peer']:.3f}x | {ratios['vs_cublas']:.0%} "
            f"| {ratios['vs_roofline']:.1%} | {_winner(case)} |"
        )
    return lines


def main() -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("runs", type=Path, nargs="+", help="bench_gemm.py --out files")
    args = parser.parse_args()
    print("\n".join(rows([json.loads(p.read_text()) for p in args.runs])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
