"""bench_gemm.py's results as a Markdown table: one row per (projection, T, routing).

Times in ms; then the three ratios of moe_shapes.target_ratios (the better peer's time over moetune's,
cuBLAS's same-FLOP time over moetune's, the HBM roofline of the touched weights over moetune's time) and
the winning moetune config abbreviated: per-warpgroup block_m x block_n, block_k, stages; ws-n / ws-m =
a producer and two consumer warpgroups split along N / M, plain = one warpgroup; np = one CTA per tile;
sk = split-K; the grid order and width unless m8; "(pack)" = the config pack's winner for the shape.

    python3 lab/bench/gemm_table.py gate_up.json down.json     # bench_gemm.py --out files
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from moetune_lab.bench import moe_shapes

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


def winner_of(moetune: dict) -> tuple[dict, bool]:
    """The config of bench_gemm's moetune method that won (the fastest it tried) and whether it was the
    config pack's."""
    tried = moetune.get("tried", [])
    best = min(tried, key=lambda t: t["median_ms"]) if tried else {"config": moetune["config"]}
    return best["config"], bool(best.get("from_pack"))


def winner_label(config: dict, from_pack: bool) -> str:
    return config_label(config) + (" (pack)" if from_pack else "")


def _in_order(cases: list[dict]) -> list[dict]:
    """Projections and routings in the order they first appear, T ascending (runs may split one
    projection's token counts between them, in any order)."""
    projs = list(dict.fromkeys(c["proj"] for c in cases))
    routings = list(dict.fromkeys(c["routing"] for c in cases))
    return sorted(cases, key=lambda c: (projs.index(c["proj"]), c["tokens"], routings.index(c["routing"])))


def rows(cases: list[dict]) -> list[str]:
    """The table of bench_gemm cases: each has proj, tokens, routing, hbm_roofline_ms and methods
    ({name: {"median_ms": ...}}), and a `winner` label or moetune's tried configs."""
    lines = [HEADER, "|" + " --- |" * HEADER.count(" |")]
    for case in _in_order(cases):
        ms = {name: case["methods"].get(name, {}).get("median_ms") for name in METHODS}
        ratios = moe_shapes.target_ratios(case)
        times = " | ".join(f"{ms[name]:.3f}" if ms[name] else "-" for name in METHODS)
        cublas = case["methods"]["cublas_torch"]["median_ms"]
        winner = case.get("winner") or winner_label(*winner_of(case["methods"]["moetune"]))
        lines.append(
            f"| {case['proj']} | {case['tokens']} | {case['routing']} | {times} | {cublas:.3f} "
            f"| {case['hbm_roofline_ms']:.3f} | {ratios['vs_peer']:.3f}x | {ratios['vs_cublas']:.0%} "
            f"| {ratios['vs_roofline']:.1%} | {winner} |"
        )
    return lines


def main() -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("runs", type=Path, nargs="+", help="bench_gemm.py --out files")
    args = parser.parse_args()
    cases = [case for path in args.runs for case in json.loads(path.read_text())["cases"]]
    print("\n".join(rows(cases)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
