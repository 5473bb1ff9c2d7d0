"""A leave-one-out of the mosaic_gpu heuristic: for each cost-model constant that the package's calibration
file fits across several development shapes, refit it without one shape's measurements, rank that shape
with the refitted constant, and report the pick beside the pick of the full fit, with the measured time of
each where the baselines hold a row of that config on that shape.

    python -m moetune_lab.bench.leave_one_out [--baselines lab/baselines/nvidia_h200.json] [--json OUT]

A constant fitted to one shape's measurements has nothing left to fit without it: it is listed as such.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from moetune.kernels.backends.mosaic_gpu import calibration, cost_model, space
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.problem import GROUPED_MATMUL, GROUPED_MATMUL_SWIGLU, Problem

BASELINES = Path(__file__).resolve().parents[1] / "baselines" / "nvidia_h200.json"
H200 = DeviceFingerprint("NVIDIA H200", "gpu", 132, 0, "9.0", "", "", "", "")
# A row's config fields and the peer that timed each.
CONFIG_PEERS = {
    "tuned_config": "moetune_tuned",
    "alternative_config": "moetune_alternative",
    "one_block_steps_config": "moetune_one_block_steps",
}


@contextlib.contextmanager
def constants(values: dict[str, float]) -> Iterator[None]:
    """The cost model with `values` in place of its constants, for the duration."""
    saved = {name: getattr(cost_model, name) for name in values}
    try:
        for name, value in values.items():
            setattr(cost_model, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(cost_model, name, value)


def estimate(problem: dict, config: dict, values: dict[str, float]) -> float:
    with constants(values):
        return cost_model.estimate(Problem(**problem), MosaicGpuConfig(**config), H200).seconds


def shape(problem: dict) -> str:
    """A development shape: the problem's key (op, M, K, N, G, dtypes, scales)."""
    return Problem(**problem).key


def entry_problem(entry: dict) -> Problem | None:
    """The problem a baselines row timed, where its params say (fine-grained, bench_gemm and FP8 rows)."""
    params = entry.get("params", {})
    dims = {k: params.get(k) for k in ("m", "k", "n", "g")}
    if None not in dims.values():
        op = params.get("op") or (
            GROUPED_MATMUL_SWIGLU if params.get("proj") == "gate_up" else GROUPED_MATMUL
        )
        return Problem(op, **dims)
    if {"model", "gemm", "tokens", "layout"} <= set(params):
        from moetune_lab.bench.bench_fp8 import fp8_problem
        from moetune_lab.bench.dev_shapes import MODELS, Case

        return fp8_problem(Case(MODELS[params["model"]], params["gemm"], params["tokens"]), params["layout"])
    return None


def measured_times(baselines: dict) -> dict[tuple[str, str], float]:
    """(problem key, config JSON) -> the median (s) of every row and peer that names its config."""
    out: dict[tuple[str, str], float] = {}
    for entry in baselines["entries"]:
        problem = entry_problem(entry)
        if problem is None or "config" not in entry:
            continue
        scale = 1e-3 if entry.get("unit") == "ms" else 1.0
        timed = [(entry["config"], entry["median"])]
        for field, peer in CONFIG_PEERS.items():
            if field in entry["params"] and peer in entry.get("peers", {}):
                timed.append((entry["params"][field], entry["peers"][peer]["median"]))
        for config, median in timed:
            key = (problem.key, json.dumps(MosaicGpuConfig(**config).to_dict(), sort_keys=True))
            out.setdefault(key, median * scale)
    return out


@dataclasses.dataclass(frozen=True)
class Row:
    constant: str
    left_out: str  # the shape whose measurements the refit leaves out
    full_fit: float
    refit: float | None  # None: no pair left has a root
    pick: dict[str, Any]  # the heuristic's config for the left-out shape under the refit
    full_pick: dict[str, Any]  # under the full fit
    pick_s: float | None  # the baselines' measured time of `pick` on that shape, where they hold it
    full_pick_s: float | None

    @property
    def same_pick(self) -> bool:
        return self.pick == self.full_pick


def pick(problem: Problem, values: dict[str, float]) -> dict[str, Any]:
    with constants(values):
        return space.heuristic(problem, H200).to_dict()


def leave_one_out(cal: calibration.Calibration, baselines: dict) -> tuple[list[Row], list[str]]:
    """Rows of every (constant fitted across several shapes, shape left out); and the fitted constants
    that span one shape only, which a leave-one-out cannot refit."""
    times = measured_times(baselines)
    rows: list[Row] = []
    single: list[str] = []
    for name, constant in sorted(cal.constants.items()):
        if constant["evidence"] is None:
            continue
        by_shape: dict[str, Problem] = {}
        for pair in calibration.pairs(constant["evidence"]):
            side = cal.measurements[pair["measurement"]]["sides"][pair["slower"]]
            by_shape[shape(side["problem"])] = Problem(**side["problem"])
        if len(by_shape) < 2:
            single.append(name)
            continue
        full = calibration.refit(cal, name, estimate)
        for left_out, problem in by_shape.items():

            def other_shapes(pair: dict[str, str], left_out: str = left_out) -> bool:
                side = cal.measurements[pair["measurement"]]["sides"][pair["slower"]]
                return shape(side["problem"]) != left_out

            refit = calibration.refit(cal, name, estimate, keep=other_shapes)
            held = {k: c["value"] for k, c in cal.constants.items()}
            full_pick = pick(problem, dict(held, **{name: full}))
            loo_pick = pick(problem, dict(held, **{name: refit})) if refit is not None else full_pick
            timed = [times.get((problem.key, json.dumps(c, sort_keys=True))) for c in (loo_pick, full_pick)]
            rows.append(Row(name, left_out, full, refit, loo_pick, full_pick, *timed))
    return rows, single


def report(rows: list[Row], single: list[str]) -> str:
    lines = []
    for r in rows:
        refit = "no root" if r.refit is None else f"{r.refit:.4g}"
        timed = ["not timed" if t is None else f"{t * 1e3:.4g} ms" for t in (r.pick_s, r.full_pick_s)]
        verdict = "same pick" if r.same_pick else "other pick"
        head = f"{r.constant} without {r.left_out}: {refit} (full fit {r.full_fit:.4g})"
        lines.append(f"{head}, {verdict}, measured {timed[0]} (the full fit's pick: {timed[1]})")
    for name in single:
        lines.append(f"{name}: fitted to one shape's measurements; nothing is left to refit without it")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baselines", type=Path, default=BASELINES)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    rows, single = leave_one_out(calibration.load(), json.loads(args.baselines.read_text()))
    print(report(rows, single))
    if args.json:
        payload = {"rows": [dataclasses.asdict(r) for r in rows], "single_shape": single}
        args.json.write_text(json.dumps(payload, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
