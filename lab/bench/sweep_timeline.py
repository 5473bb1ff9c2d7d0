"""Where a sweep's time went, from its database: per trial, the wall time from the start of compilation
to the result, split by whether it was the worker's first trial of that problem (the worker made the
problem's inputs and compiled their XLA programs then) or a later one; the trials' phases (set-up and its
parts, waiting for the device's lane, verifying, timing; recorded in the trials' details since they
exist, see tuner/candidate.py PHASES); how idle each worker was between its trials (the driver's and
Ray's stalls); how busy each device lane was over time (lanes inferred from the trials); and the sweep's
throughput. Works on any moetune database.

    python3 lab/bench/sweep_timeline.py sweep.db --sweep 1 [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from moetune.db.store import open_any_revision
from moetune.tuner.candidate import PHASES


def _summary(values: list[float]) -> dict:
    return {"count": len(values), "median_s": statistics.median(values) if values else None}


def _phase_summary(phases: list[dict[str, float]]) -> dict:
    """Median and total of each phase over the trials that recorded it; {} when none did."""
    out = {}
    for name in PHASES:
        values = [p[name] for p in phases if name in p]
        if values:
            out[name] = {"count": len(values), "median_s": statistics.median(values), "total_s": sum(values)}
    return out


def _wall(trial) -> float:
    return (trial.finished_at - trial.started_at).total_seconds()


def _idle(trials: list) -> dict:
    """Per worker: its span (first start to last result), the sum of its trials' walls, and the fraction
    of the span it had no trial (a worker holds one trial at a time, from compile to result)."""
    by_worker: dict[str, list] = {}
    for t in trials:
        by_worker.setdefault(t.worker, []).append(t)
    out = {}
    for worker, mine in sorted(by_worker.items()):
        span = (max(t.finished_at for t in mine) - min(t.started_at for t in mine)).total_seconds()
        busy = sum(_wall(t) for t in mine)
        out[worker] = {
            "trials": len(mine),
            "span_s": span,
            "busy_s": busy,
            "idle_fraction": (span - busy) / span if span > 0 else None,
        }
    return out


# Bin width of the lanes' busy fractions over the sweep.
LANE_BIN_S = 5.0


def _device_spans(trials: list, start) -> dict[str, list[tuple[float, float]]]:
    """Per worker, the seconds (from `start`) each trial held its lane: verify and time, which end at the
    result. Trials without phase times have none."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for t in trials:
        phases = (t.details or {}).get("phases")
        if not phases:
            continue
        end = (t.finished_at - start).total_seconds()
        held = phases.get("verify_s", 0.0) + phases.get("time_s", 0.0)
        spans.setdefault(t.worker, []).append((end - held, end))
    return spans


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> bool:
    # 10 ms of slack: the lane passes from one worker to the next within the same instant.
    return any(x0 < y1 - 0.01 and y0 < x1 - 0.01 for x0, x1 in a for y0, y1 in b)


def _recorded_lanes(trials: list, workers: list[str]) -> list[list[str]] | None:
    """Workers per lane as the trials' details name it (sweeps since lanes were recorded), else None."""
    lane_of: dict[str, str] = {}
    for t in trials:
        lane = (t.details or {}).get("lane")
        if lane:
            lane_of.setdefault(t.worker, lane)
    if not workers or any(w not in lane_of for w in workers):
        return None
    return [
        sorted((w for w in workers if lane_of[w] == lane), key=lambda w: (len(w), w))
        for lane in sorted(set(lane_of.values()))
    ]


def lanes(trials: list, start, span_s: float) -> list[dict]:
    """Which workers shared a device lane, and how busy each lane was. Trials record their lane since
    2026-11-30; for older sweeps the lanes are inferred: two workers that held the device at the same
    moment are on different lanes, and workers join the first lane none of whose workers overlaps them
    (first fit)."""
    spans = _device_spans(trials, start)
    groups = _recorded_lanes(trials, list(spans))
    if groups is None:
        groups = []
        for worker in sorted(spans, key=lambda w: (len(w), w)):
            for group in groups:
                if not any(_overlap(spans[worker], spans[other]) for other in group):
                    group.append(worker)
                    break
            else:
                groups.append([worker])
    bins = max(1, int(span_s // LANE_BIN_S) + 1)
    out = []
    for group in groups:
        busy = [0.0] * bins
        for worker in group:
            for a, b in spans[worker]:
                for i in range(max(0, int(a // LANE_BIN_S)), min(bins, int(b // LANE_BIN_S) + 1)):
                    lo, hi = i * LANE_BIN_S, (i + 1) * LANE_BIN_S
                    busy[i] += max(0.0, min(b, hi) - max(a, lo))
        total = sum(b - a for w in group for a, b in spans[w])
        out.append(
            {
                "workers": group,
                "busy_fraction": total / span_s if span_s else None,
                "busy_per_bin": [round(x / LANE_BIN_S, 2) for x in busy],
            }
        )
    return out


def timeline(url: str, sweep_id: int) -> dict:
    with open_any_revision(url) as store:
        trials = [t for t in store.trials(sweep_id=sweep_id) if t.started_at and t.finished_at]
    trials.sort(key=lambda t: t.started_at)
    seen: set[tuple[str, str]] = set()
    groups = {"first": [], "later": []}
    for t in trials:
        key = (t.worker, t.problem.key)
        groups["later" if key in seen else "first"].append(t)
        seen.add(key)
    start, end = trials[0].started_at, max(t.finished_at for t in trials)
    span = (end - start).total_seconds()

    def group(members: list) -> dict:
        phases = [t.details["phases"] for t in members if t.details and t.details.get("phases")]
        return (
            _summary([_wall(t) for t in members])
            | {"compile": _summary([t.compile_s or 0.0 for t in members])}
            | {"phases": _phase_summary(phases)}
        )

    idle = _idle(trials)
    total_span = sum(w["span_s"] for w in idle.values())
    return {
        "trials": len(trials),
        "span_s": span,
        "per_minute": len(trials) / span * 60 if span else None,
        "workers": len(idle),
        "problems": len({t.problem.key for t in trials}),
        "first_trial_of_a_problem_on_a_worker": group(groups["first"]),
        "later_trials": group(groups["later"]),
        "idle_fraction": (
            sum(w["span_s"] - w["busy_s"] for w in idle.values()) / total_span if total_span else None
        ),
        "worker_idle": idle,
        "lanes": lanes(trials, start, span),
    }


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _print(result: dict) -> None:
    f, later = result["first_trial_of_a_problem_on_a_worker"], result["later_trials"]
    print(
        f"{result['trials']} trials of {result['problems']} problems on {result['workers']} workers in "
        f"{result['span_s']:.0f} s ({result['per_minute']:.1f}/min, first start to last result)"
    )
    print(
        f"a worker's first trial of a problem: {f['count']}, median {_seconds(f['median_s'])} "
        f"(compile {_seconds(f['compile']['median_s'])})"
    )
    print(
        f"its later trials of that problem:  {later['count']}, median {_seconds(later['median_s'])} "
        f"(compile {_seconds(later['compile']['median_s'])})"
    )
    if f["phases"] or later["phases"]:
        print("phases (seconds)         first trials: median    total | later trials: median    total")
        for name in PHASES:
            cells = []
            for g in (f, later):
                p = g["phases"].get(name)
                cells.append(f"{p['median_s']:20.3f} {p['total_s']:8.1f}" if p else f"{'-':>20} {'-':>8}")
            print(f"  {name:<20} {cells[0]} | {cells[1]}")
    else:
        print("no phase times recorded (trials from before they were)")
    idle = result["idle_fraction"]
    print(f"workers idle between trials: {'-' if idle is None else f'{idle:.0%}'} of their spans")
    for worker, w in result["worker_idle"].items():
        fraction = "-" if w["idle_fraction"] is None else f"{w['idle_fraction']:.0%}"
        print(
            f"  {worker:<12} {w['trials']:4d} trials, busy {w['busy_s']:7.0f} s of {w['span_s']:7.0f} s, "
            f"idle {fraction}"
        )
    print(
        "device lanes (recorded, or for older sweeps inferred: workers that held the device at once are "
        f"on different lanes), busy per {LANE_BIN_S:.0f} s:"
    )
    for i, lane in enumerate(result["lanes"]):
        print(f"  lane {i}: {len(lane['workers'])} workers, busy {lane['busy_fraction']:.0%} of the span")
        print("    " + " ".join(f"{x:.2f}" for x in lane["busy_per_bin"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", type=Path)
    parser.add_argument("--sweep", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = timeline(f"sqlite:///{args.db}", args.sweep)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        _print(result)


if __name__ == "__main__":
    main()
