"""Where a sweep's time went, from its database: per trial, the wall time from the start of compilation
to the result, split by whether it was the worker's first trial of that problem (the worker made the
problem's inputs and compiled their XLA programs then) or a later one; and the sweep's throughput over
time. Works on any moetune database.

    python3 benchmarks/sweep_timeline.py results/2026-11-29_h200_e2e_sweep.db --sweep 1 [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from moetune.db import open_store


def timeline(url: str, sweep_id: int) -> dict:
    with open_store(url) as store:
        trials = [t for t in store.trials(sweep_id=sweep_id) if t.started_at and t.finished_at]
    trials.sort(key=lambda t: t.started_at)
    seen: set[tuple[str, str]] = set()
    first, later, compile_first, compile_later = [], [], [], []
    for t in trials:
        key = (t.worker, t.problem.key)
        wall = (t.finished_at - t.started_at).total_seconds()
        if key in seen:
            later.append(wall)
            compile_later.append(t.compile_s or 0.0)
        else:
            seen.add(key)
            first.append(wall)
            compile_first.append(t.compile_s or 0.0)
    start, end = trials[0].started_at, max(t.finished_at for t in trials)
    span = (end - start).total_seconds()

    def summary(values: list[float]) -> dict:
        return {"count": len(values), "median_s": statistics.median(values) if values else None}

    return {
        "trials": len(trials),
        "span_s": span,
        "per_minute": len(trials) / span * 60 if span else None,
        "workers": len({t.worker for t in trials}),
        "problems": len({t.problem.key for t in trials}),
        "first_trial_of_a_problem_on_a_worker": summary(first) | {"compile": summary(compile_first)},
        "later_trials": summary(later) | {"compile": summary(compile_later)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", type=Path)
    parser.add_argument("--sweep", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = timeline(f"sqlite:///{args.db}", args.sweep)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    f, later = result["first_trial_of_a_problem_on_a_worker"], result["later_trials"]
    print(
        f"{result['trials']} trials of {result['problems']} problems on {result['workers']} workers in "
        f"{result['span_s']:.0f} s ({result['per_minute']:.1f}/min, first start to last result)"
    )
    print(
        f"a worker's first trial of a problem: {f['count']}, median {f['median_s']:.1f} s "
        f"(compile {f['compile']['median_s']:.1f} s)"
    )
    print(
        f"its later trials of that problem:  {later['count']}, median {later['median_s']:.1f} s "
        f"(compile {later['compile']['median_s']:.1f} s)"
    )


if __name__ == "__main__":
    main()
