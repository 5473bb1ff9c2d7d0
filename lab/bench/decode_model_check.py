"""How well the fused decode block's cost model (cost_model_decode.py) predicts each of its two kernels,
from a sweep's database: every fused trial whose details hold its kernels' CUPTI times (the trial details'
`kernels`), beside the model's estimate of that kernel for the trial's config on the trial's device.

Per problem and kernel it reports the trials, the median and spread of measured / estimated, and
Spearman's rank correlation of the two over the trials: whether the model orders configs as the GPU does,
which is what the heuristic's pick rests on (a constant factor off leaves the pick as it is). Kernels are
matched by name (space_decode.KERNELS); any other launch of a trial is summed as `other`.

    python3 lab/bench/decode_model_check.py sweep.db [--sweep N] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

from moetune.db.store import open_any_revision
from moetune.kernels.backends.mosaic_gpu import cost_model_decode, space_decode
from moetune.kernels.backends.mosaic_gpu.kernel_decode import DecodeBlockConfig
from moetune.kernels.errors import MoetuneError

# The block's kernels as CUPTI names them (space_decode.KERNELS, kernel 1 first), and the estimate of each.
KERNELS = dict(zip(space_decode.KERNELS, ("up", "down"), strict=True))
BLOCK_OPS = ("moe_decode_block", "moe_decode_block_fp8")


def _ranks(values: list[float]) -> np.ndarray:
    """Each value's rank, ties at the mean of their ranks."""
    array = np.asarray(values, dtype=float)
    ranks = np.empty(len(array))
    ranks[np.argsort(array, kind="stable")] = np.arange(len(array))
    for value in np.unique(array):
        tied = array == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation; None under three points or where either side has no spread."""
    if len(xs) < 3:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


def rows(store: Any, trials: list) -> list[dict]:
    """One row per fused block trial with kernel times: its problem key, config, and per kernel the
    measured and estimated seconds (on the trial's own device)."""
    devices: dict[str, Any] = {}
    out = []
    for t in trials:
        kernels = (t.details or {}).get("kernels")
        if t.status != "ok" or t.problem.op not in BLOCK_OPS or not kernels or not t.config.get("fused"):
            continue
        if t.fingerprint_hash not in devices:
            devices[t.fingerprint_hash] = store.device(t.fingerprint_hash)
        try:
            config = DecodeBlockConfig.from_dict(t.config)
            estimate = cost_model_decode.estimate(
                t.problem, config.decode_config(), devices[t.fingerprint_hash]
            )
        except MoetuneError:  # a device without hardware facts, or a config the model cannot read
            continue
        measured = {"up": 0.0, "down": 0.0, "other": 0.0}
        for name, seconds in kernels:
            measured[KERNELS.get(name, "other")] += seconds
        out.append(
            {
                "problem": t.problem.key,
                "config": t.config,
                "measured_s": measured,
                "estimated_s": {"up": estimate.up.seconds, "down": estimate.down.seconds},
            }
        )
    return out


def summary(table: list[dict]) -> dict:
    """Per problem, per kernel: trials, median / min / max of measured over estimated, rank correlation."""
    by_problem: dict[str, list[dict]] = {}
    for row in table:
        by_problem.setdefault(row["problem"], []).append(row)
    out = {}
    for problem, mine in by_problem.items():
        out[problem] = {}
        for kernel in ("up", "down"):
            measured = [r["measured_s"][kernel] for r in mine]
            estimated = [r["estimated_s"][kernel] for r in mine]
            ratios = [m / e for m, e in zip(measured, estimated, strict=True) if e > 0]
            out[problem][kernel] = {
                "trials": len(mine),
                "ratio_median": statistics.median(ratios) if ratios else None,
                "ratio_min": min(ratios, default=None),
                "ratio_max": max(ratios, default=None),
                "spearman": spearman(measured, estimated),
                "best_measured_s": min(measured),
            }
        out[problem]["other_median_s"] = statistics.median(r["measured_s"]["other"] for r in mine)
    return out


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", type=Path, help="a moetune SQLite database (a sweep's)")
    parser.add_argument("--sweep", type=int, help="one sweep's trials (default: every sweep's)")
    parser.add_argument("--json", action="store_true", help="print the rows and summary as JSON")
    args = parser.parse_args(argv)
    if not args.database.is_file():
        parser.error(f"no such database: {args.database}")
    with open_any_revision(f"sqlite:///{args.database}") as store:
        table = rows(store, store.trials(sweep_id=args.sweep))
    if not table:
        print("no fused decode-block trial with kernel times in that database", file=sys.stderr)
        raise SystemExit(1)
    result = {"rows": table, "summary": summary(table)}
    if args.json:
        print(json.dumps(result, indent=1))
        return result
    for problem, kernels in result["summary"].items():
        print(problem)
        for kernel in ("up", "down"):
            k = kernels[kernel]
            spread = f"{_fmt(k['ratio_min'], '.2f')}-{_fmt(k['ratio_max'], '.2f')}"
            print(
                f"  {kernel:4s} {k['trials']} trials: measured/estimated median "
                f"{_fmt(k['ratio_median'], '.2f')} ({spread}), "
                f"rank correlation {_fmt(k['spearman'], '.2f')}, best {k['best_measured_s'] * 1e6:.1f} us"
            )
        print(f"  other launches: {kernels['other_median_s'] * 1e6:.1f} us (median)")
    return result


if __name__ == "__main__":
    main()
