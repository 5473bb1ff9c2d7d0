"""Compare two `moetune bench tuner --out` results of the same sweep on different clusters (one GPU, two):
the Ray throughput ratio, and per problem whether the best candidates agree (the same config, or best
times within --tolerance of each other).

    python3 benchmarks/compare_clusters.py one_gpu.json two_gpus.json --out multi_gpu.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path


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
    return {
        "throughput_ratio": ratio,
        "base_per_minute": base["ray"]["per_minute"],
        "other_per_minute": other["ray"]["per_minute"],
        "winners_agree": sum(p["agree"] for p in problems.values()),
        "problems": problems,
        "tolerance": tolerance,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path)
    parser.add_argument("other", type=Path)
    parser.add_argument("--tolerance", type=float, default=0.02)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    base, other = (json.loads(p.read_text()) for p in (args.base, args.other))
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
    for key, p in result["problems"].items():
        print(
            f"  {key}: agree={p['agree']} same_config={p.get('same_config')} gap={p.get('time_gap', 0):+.2%}"
        )


if __name__ == "__main__":
    main()
