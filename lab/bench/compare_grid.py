"""The search against the exhaustive grid: for every problem the grid database covers, the sweep's winner
(TPE over the whole space) against the best config of the grid (every config of a narrowed space), both
timed the same way (same timer, routings, seeds and inputs). Agreement: the sweep's winner is at most
--tolerance slower than the grid's best.

    python3 lab/bench/compare_grid.py sweep.db grid.db --out grid_vs_sweep.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

from moetune.db.store import open_any_revision


def best_of(store, problem_key: str):
    """The promoted winner (its time from the interleaved re-timing of the finalists), else the fastest
    ok trial. Winners on both sides: the minimum of hundreds of noisy medians would be biased low."""
    winners = store.winners(problem_key=problem_key)
    if winners:
        return winners[0]
    trials = [t for t in store.trials(problem_key=problem_key) if t.status == "ok" and t.median_s]
    return min(trials, key=lambda t: t.median_s) if trials else None


def compare(sweep_url: str, grid_url: str, tolerance: float) -> dict:
    rows = []
    with open_any_revision(sweep_url) as sweep, open_any_revision(grid_url) as grid:
        keys = sorted({t.problem.key for t in grid.trials()})
        for key in keys:
            grid_best = best_of(grid, key)
            winner = best_of(sweep, key)
            row = {
                "problem": key,
                "grid_trials": len(grid.trials(problem_key=key)),
                "sweep_trials": len(sweep.trials(problem_key=key)),
                "grid_best": None
                if grid_best is None
                else {"config": grid_best.config, "median_s": grid_best.median_s},
                "sweep_winner": None
                if winner is None
                else {"config": winner.config, "median_s": winner.median_s},
            }
            if grid_best is not None and winner is not None and winner.median_s:
                row["gap"] = winner.median_s / grid_best.median_s - 1
                row["within"] = row["gap"] <= tolerance
            rows.append(row)
    return {"tolerance": tolerance, "problems": rows, "within": sum(bool(r.get("within")) for r in rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_db", type=Path)
    parser.add_argument("grid_db", type=Path)
    parser.add_argument("--tolerance", type=float, default=0.02)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
    } | compare(f"sqlite:///{args.sweep_db}", f"sqlite:///{args.grid_db}", args.tolerance)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, sort_keys=True))
    for row in result["problems"]:
        gap = f"{row['gap']:+.2%}" if "gap" in row else "n/a"
        print(
            f"{row['problem']}: grid {row['grid_trials']} trials, sweep {row['sweep_trials']}; "
            f"winner vs grid best {gap}"
        )
    print(f"within {result['tolerance']:.0%} on {result['within']} of {len(result['problems'])} problems")


if __name__ == "__main__":
    main()
