"""Compare two runs of the same tuning work on different clusters (one GPU, two): the Ray throughput
ratio, and per problem whether the best candidates agree (the same config, or best times within
--tolerance of each other). A run is a `moetune bench tuner --out` JSON file or a sweep's database: for a
database, the throughput is sweep --sweep's trials per minute from the first start to the last result, and
each problem's best is its promoted winner (re-timed interleaved), else its fastest ok trial; and every
config that both databases timed for the same problem is compared too (the spread of their time ratios:
two sweeps over the same candidates should time each alike, and a ratio far from 1 means a disturbed
timing in one of them).

    python3 lab/bench/compare_clusters.py one_gpu.json two_gpus.json --out multi_gpu.json
    python3 lab/bench/compare_clusters.py one_gpu.db two_gpus.db --out multi_gpu.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
from pathlib import Path


def from_database(path: Path, sweep_id: int) -> dict:
    """A sweep's database in the shape of `bench tuner --out`'s "ray" run: its candidates only (trials of
    the sweep's backend; the XLA baselines of another backend's sweep are left out), and per problem the
    winner this sweep promoted, else its fastest ok candidate."""
    from moetune.db.store import open_any_revision

    with open_any_revision(f"sqlite:///{path}") as store:
        backend = store.get_sweep(sweep_id).backend
        trials = [
            t
            for t in store.trials(sweep_id=sweep_id)
            if t.started_at and t.finished_at and t.backend == backend
        ]
        if not trials:
            raise SystemExit(f"{path}: sweep {sweep_id} has no finished {backend} trials")
        span = (max(t.finished_at for t in trials) - min(t.started_at for t in trials)).total_seconds()
        ok = [t for t in trials if t.status == "ok" and t.median_s]
        times: dict[str, dict[str, float]] = {}
        for t in ok:
            times.setdefault(t.problem.key, {})[json.dumps(t.config, sort_keys=True)] = t.median_s
        ids = {t.id for t in trials}
        best = {}
        for key in sorted({t.problem.key for t in trials}):
            promoted = [w for w in store.winners(problem_key=key, backend=backend) if w.trial_id in ids]
            mine = [t for t in ok if t.problem.key == key]
            chosen = promoted[0] if promoted else min(mine, key=lambda t: t.median_s) if mine else None
            if chosen is not None:
                best[key] = {"config": chosen.config, "median_s": chosen.median_s}
        workers = len({t.worker for t in trials})
    return {
        "source": str(path),
        "ray": {
            "variants": len(trials),
            "elapsed_s": span,
            "per_minute": len(trials) / span * 60 if span else 0.0,
            "workers": workers,
            "best": best,
        },
        "times": times,
    }


def load(path: Path, sweep_id: int) -> dict:
    return from_database(path, sweep_id) if path.suffix == ".db" else json.loads(path.read_text())


def compare(base: dict, other: dict, tolerance: float) -> dict:
    problems = {}
    for key, best in sorted(base["ray"]["best"].items()):
        theirs = other["ray"]["best"].get(key)
        if theirs is None:
            problems[key] = {"agree": False, "why": "no ok candidate in the second run"}
            continue
        same = best["config"] == theirs["config"]
        gap = theirs["median_s"] / best["median_s"] - 1
        problems[key] = {
            "agree": same or abs(gap) <= tolerance,
            "same_config": same,
            "time_gap": gap,
            "base": best,
            "other": theirs,
        }
    ratio = other["ray"]["per_minute"] / base["ray"]["per_minute"] if base["ray"]["per_minute"] else 0.0
    return _same_configs(base, other) | {
        "throughput_ratio": ratio,
        "base_per_minute": base["ray"]["per_minute"],
        "other_per_minute": other["ray"]["per_minute"],
        "winners_agree": sum(p["agree"] for p in problems.values()),
        "problems": problems,
        "tolerance": tolerance,
    }


def _same_configs(base: dict, other: dict) -> dict:
    """How alike the two runs timed the configs both timed: other / base, per (problem, config)."""
    ratios = [
        theirs / mine
        for key, configs in base.get("times", {}).items()
        for config, mine in configs.items()
        if (theirs := other.get("times", {}).get(key, {}).get(config))
    ]
    if not ratios:
        return {}
    q = statistics.quantiles(ratios, n=20) if len(ratios) > 1 else ratios * 2
    return {
        "same_configs": {
            "count": len(ratios),
            "ratio_p5": q[0],
            "ratio_median": statistics.median(ratios),
            "ratio_p95": q[-1],
            "off_by_10pct": sum(abs(math.log(r)) > math.log(1.1) for r in ratios),
            "off_by_30pct": sum(abs(math.log(r)) > math.log(1.3) for r in ratios),
        }
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path)
    parser.add_argument("other", type=Path)
    parser.add_argument("--tolerance", type=float, default=0.02)
    parser.add_argument("--sweep", type=int, default=1, help="the sweep to read from a database")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    base, other = (load(p, args.sweep) for p in (args.base, args.other))
    result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "base_run": base,
        "other_run": other,
    } | compare(base, other, args.tolerance)
    text = json.dumps(result, indent=1, sort_keys=True)
    if args.out:
        args.out.write_text(text)
    print(
        f"throughput {result['other_per_minute']:.1f} vs {result['base_per_minute']:.1f} variants/min "
        f"({result['throughput_ratio']:.2f}x); best configs agree on {result['winners_agree']} of "
        f"{len(result['problems'])} problems"
    )
    if "same_configs" in result:
        c = result["same_configs"]
        print(
            f"configs timed by both: {c['count']}, time ratio p5 {c['ratio_p5']:.3f} median "
            f"{c['ratio_median']:.3f} p95 {c['ratio_p95']:.3f}; off by >10%: {c['off_by_10pct']}, "
            f">30%: {c['off_by_30pct']}"
        )
    for key, p in result["problems"].items():
        print(
            f"  {key}: agree={p['agree']} same_config={p.get('same_config')} gap={p.get('time_gap', 0):+.2%}"
        )


if __name__ == "__main__":
    main()
