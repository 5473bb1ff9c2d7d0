"""A leave-one-out of the mosaic_gpu heuristic, two ways.

By shape: for each cost-model constant that the package's calibration file fits across several
development shapes, refit it without one shape's measurements, rank that shape with the refitted
constant, and report the pick beside the pick of the full fit, with the measured time of each where the
baselines hold a row of that config on that shape. A constant fitted to one shape's measurements has
nothing left to fit without it: it is listed as such.

Across shapes: the constants the file fits from no measurement (ACROSS) are fitted to the baselines'
timed (shape, config) pairs, so that the model orders the configs timed on one shape as the GPU did
(`loss`, `fit`). The shapes fall into one group per model (`model_groups`); each group in turn is held
out, the constants fitted to the others, and the held-out shapes scored under the refit beside the
shipped values: the pairs of configs ordered as measured, the median error of the estimates, and whether
the heuristic's pick changes, with the measured time of both picks where the baselines hold them. Last,
the fit to every group: the values a calibration update would take, in-sample, not a prediction. The
weight-gradient kernel's rows are left out: it has a cost model of its own.

    python -m moetune_lab.bench.leave_one_out [--baselines lab/baselines/nvidia_h200.json] [--json OUT]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import itertools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

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
    """The cost model with `values` in place of its constants, for the duration. The space caches each
    problem's ranking whatever the constants, so the cache is emptied on the way in and out."""
    saved = {name: getattr(cost_model, name) for name in values}
    try:
        for name, value in values.items():
            setattr(cost_model, name, value)
        space.ranking.cache_clear()
        yield
    finally:
        for name, value in saved.items():
            setattr(cost_model, name, value)
        space.ranking.cache_clear()


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


def timed_rows(baselines: dict) -> Iterator[tuple[Problem, dict[str, Any], float]]:
    """(problem, config, median in s) of every row and peer that names its config, in the file's order."""
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
            yield problem, MosaicGpuConfig(**config).to_dict(), median * scale


@dataclasses.dataclass(frozen=True)
class Timed:
    problem: Problem
    config: dict[str, Any]
    seconds: float  # the baselines' median


def timed_key(problem: Problem, config: dict[str, Any]) -> tuple[str, str]:
    return problem.key, json.dumps(config, sort_keys=True)


def timed_configs(baselines: dict) -> list[Timed]:
    """Every (shape, config) the baselines timed, the first median of each kept."""
    out: dict[tuple[str, str], Timed] = {}
    for problem, config, seconds in timed_rows(baselines):
        out.setdefault(timed_key(problem, config), Timed(problem, config, seconds))
    return list(out.values())


def times_of(timed: list[Timed]) -> dict[tuple[str, str], float]:
    """(problem key, config JSON) -> the median (s)."""
    return {timed_key(t.problem, t.config): t.seconds for t in timed}


def measured_times(baselines: dict) -> dict[tuple[str, str], float]:
    """(problem key, config JSON) -> the median (s) of every row and peer that names its config."""
    return times_of(timed_configs(baselines))


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
            timed = [times.get(timed_key(problem, c)) for c in (loo_pick, full_pick)]
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


# --- Across shapes: constants without evidence, fitted to how the model orders timed configs -----------

# Constants that set a config's time, are fitted from no pair of measurements, and change how the model
# orders configs the baselines timed on one shape: the per-item store, a CTA's start in a grid of one CTA
# per item, the wgmma issue overhead and the two tensor-core handicaps. Left out: LAUNCH_S moves every
# config of a shape alike, the walk's pairs are fitted against PROLOGUE_S, and REDUCTION_S and PAD_S
# separate no timed pair.
ACROSS = ("EPILOGUE_S", "CTA_S", "WGMMA_ISSUE_CYCLES", "PLAIN_MMA_EFFICIENCY", "M_SPLIT_MMA_EFFICIENCY")
# A fit tries each constant on a log-spaced grid from BRACKET[0] to BRACKET[1] times its shipped value,
# GRID_STEPS_PER_OCTAVE points per factor of two; an efficiency stops at 1.
BRACKET = (0.25, 4.0)
GRID_STEPS_PER_OCTAVE = 4
SWEEPS = 4
# Configs timed on one shape closer than this factor are a tie: their order is noise.
DISTINCT = 1.03
# The logistic loss's scale on log-time differences: the measured order of a pair 3% apart is held with
# 73% confidence, of one 10% apart with 97%.
ORDER_SCALE = 0.03
# The weight of the mean squared log(estimate / measured): small, so that order decides and the level
# settles what order leaves open.
LEVEL_WEIGHT = 0.1


def forward_kernel(problem: Problem) -> bool:
    """Whether the problem runs the kernel this cost model estimates: the weight gradient (one output
    slice per expert) and the routed decode block have cost models of their own."""
    return not (problem.spec.out_grouped or problem.spec.routed)


def weight_dims(problem: Problem) -> tuple[int, int, int]:
    """(experts, smaller, larger) of K and the output's columns: a gated op's output is half its rhs
    columns, so its gate_up (K=H, N=2F) reads (g, H, F) in some order, as the down (K=F, N=H) does."""
    low, high = sorted((problem.k, problem.out_n))
    return problem.g, low, high


def model_groups(problems: list[Problem]) -> dict[Problem, str]:
    """Each problem's group: the shapes of one model. Two problems share a group where they have the
    same expert count and the same pair of dims (`weight_dims`), or where one's pair is the other's with
    one dim doubled: an ungated op that reads both halves of the gate_up weights (its input gradient,
    K=2F, N=H) joins the model's gate_up and down. A group is labelled by its experts and its pair with
    no dim doubled, e.g. "g=8,dims=4096/14336"."""
    keys = sorted({weight_dims(p) for p in problems})
    parent = {key: key for key in keys}

    def root(key: tuple[int, int, int]) -> tuple[int, int, int]:
        while parent[key] != key:
            key = parent[key]
        return key

    def smaller_first(key: tuple[int, int, int]) -> tuple[int, tuple[int, int, int]]:
        return key[1] * key[2], key

    for g, low, high in keys:
        for doubled in ((g, *sorted((2 * low, high))), (g, low, 2 * high)):
            if doubled in parent:
                kept, joined = sorted((root((g, low, high)), root(doubled)), key=smaller_first)
                parent[joined] = kept
    return {p: "g={},dims={}/{}".format(*root(weight_dims(p))) for p in problems}


def grid(name: str, shipped: float) -> np.ndarray:
    """The values a fit tries for `name`: log-spaced over BRACKET around the shipped value, which is one
    of them."""
    lo, hi = (round(GRID_STEPS_PER_OCTAVE * np.log2(f)) for f in BRACKET)
    values = shipped * 2.0 ** (np.arange(lo, hi + 1) / GRID_STEPS_PER_OCTAVE)
    if name.endswith("_EFFICIENCY"):
        values = np.unique(np.minimum(values, 1.0))
    return values


@dataclasses.dataclass(frozen=True)
class Pairs:
    """Pairs of configs timed on one shape: indices into the timed list, and the measured log-time
    difference of the first against the second (positive where the first measured slower)."""

    first: np.ndarray
    second: np.ndarray
    measured: np.ndarray

    def __len__(self) -> int:
        return len(self.measured)

    def differences(self, log_estimate: np.ndarray) -> np.ndarray:
        return log_estimate[self.first] - log_estimate[self.second]

    def ordered(self, log_estimate: np.ndarray) -> int:
        """Pairs whose estimates order them as measured."""
        return int(np.sum(np.sign(self.measured) * self.differences(log_estimate) > 0))


def distinct_pairs(timed: list[Timed], keep: np.ndarray) -> Pairs:
    """The pairs of kept configs timed on one shape whose medians differ by more than DISTINCT."""
    by_shape: dict[str, list[int]] = {}
    for i in np.flatnonzero(keep):
        by_shape.setdefault(timed[i].problem.key, []).append(int(i))
    first, second, measured = [], [], []
    for indices in by_shape.values():
        for i, j in itertools.combinations(indices, 2):
            difference = np.log(timed[i].seconds / timed[j].seconds)
            if abs(difference) > np.log(DISTINCT):
                first.append(i)
                second.append(j)
                measured.append(difference)
    return Pairs(np.array(first, dtype=int), np.array(second, dtype=int), np.array(measured))


class Estimates:
    """The model's log seconds of every timed config under the shipped constants, some replaced; kept
    per replacement, since the folds of a leave-one-group-out try many of the same values."""

    def __init__(self, timed: list[Timed], shipped: dict[str, float]):
        self.timed = timed
        self.shipped = shipped
        self.log_measured = np.log([t.seconds for t in timed])
        self._configs = [MosaicGpuConfig(**t.config) for t in timed]
        self._seen: dict[tuple[tuple[str, float], ...], np.ndarray] = {}

    def log_seconds(self, values: dict[str, float]) -> np.ndarray:
        key = tuple(sorted((k, v) for k, v in values.items() if v != self.shipped[k]))
        if key not in self._seen:
            with constants(dict(self.shipped, **values)):
                seconds = [
                    cost_model.estimate(t.problem, config, H200).seconds
                    for t, config in zip(self.timed, self._configs, strict=True)
                ]
            self._seen[key] = np.log(seconds)
        return self._seen[key]


def loss(estimates: Estimates, values: dict[str, float], pairs: Pairs, keep: np.ndarray) -> float:
    """How badly `values` order the pairs, plus LEVEL_WEIGHT times the mean squared log(estimate /
    measured) of the kept configs. The order term is the mean logistic loss of each pair's estimated
    log-time difference (over ORDER_SCALE) against the measured order, held with the confidence of the
    measured difference: far apart, that is its sign; close, the loss is least where the estimates differ
    as much as the measurements rather than where they differ most, so that a fit to the model's own
    estimates finds the constants they were made with instead of widening margins the GPU did not show."""
    log_estimate = estimates.log_seconds(values)
    order = 0.0
    if len(pairs):
        logit = pairs.differences(log_estimate) / ORDER_SCALE
        slower = 1.0 / (1.0 + np.exp(-pairs.measured / ORDER_SCALE))  # how sure the first is slower
        order = float(np.mean(np.logaddexp(0.0, logit) - slower * logit))
    error = log_estimate[keep] - estimates.log_measured[keep]
    return order + LEVEL_WEIGHT * float(np.mean(error**2) if keep.any() else 0.0)


def fit(names: tuple[str, ...], estimates: Estimates, keep: np.ndarray) -> dict[str, float]:
    """The values of `names` that minimise `loss` on the kept timed configs, by coordinate descent from
    the shipped values: each constant in turn set to the best of its grid, the others held, until a
    sweep moves none (at most SWEEPS). A tie keeps the current value, else takes the lowest."""
    pairs = distinct_pairs(estimates.timed, keep)
    values = {name: estimates.shipped[name] for name in names}
    for _ in range(SWEEPS):
        moved = False
        for name in names:
            candidates = grid(name, estimates.shipped[name])
            losses = [loss(estimates, dict(values, **{name: float(v)}), pairs, keep) for v in candidates]
            best = int(np.argmin(losses))
            if losses[best] < loss(estimates, values, pairs, keep):
                values[name] = float(candidates[best])
                moved = True
        if not moved:
            break
    return values


@dataclasses.dataclass(frozen=True)
class Scores:
    """How estimates fare on some timed configs: `ordered` of their `pairs` (those over DISTINCT) ordered
    as measured; the median |log(estimate / measured)| as a factor (1.0 is exact)."""

    ordered: int
    pairs: int
    error_factor: float


def scores(estimates: Estimates, values: dict[str, float], keep: np.ndarray) -> Scores:
    log_estimate = estimates.log_seconds(values)
    pairs = distinct_pairs(estimates.timed, keep)
    error = np.abs(log_estimate[keep] - estimates.log_measured[keep])
    return Scores(pairs.ordered(log_estimate), len(pairs), float(np.exp(np.median(error))))


@dataclasses.dataclass(frozen=True)
class ShapePick:
    shape: str
    pick: dict[str, Any]  # the heuristic's config under the refit
    shipped_pick: dict[str, Any]  # under the shipped constants
    pick_s: float | None  # the baselines' measured time of each pick on the shape, where they hold it
    shipped_pick_s: float | None

    @property
    def verdict(self) -> str:
        """The refit's pick against the shipped one: "same"; else "better" or "worse" where it measured
        faster or slower, "unknown" where the baselines lack a time of either."""
        if self.pick == self.shipped_pick:
            return "same"
        if self.pick_s is None or self.shipped_pick_s is None:
            return "unknown"
        return "better" if self.pick_s < self.shipped_pick_s else "worse"


def shape_picks(
    problems: list[Problem], refit: dict[str, float], estimates: Estimates
) -> tuple[ShapePick, ...]:
    """Each problem's heuristic pick under the refit beside the shipped one, with their measured times."""
    times = times_of(estimates.timed)
    out = []
    for problem in problems:
        picks = (pick(problem, dict(estimates.shipped, **refit)), pick(problem, estimates.shipped))
        timed = [times.get(timed_key(problem, c)) for c in picks]
        out.append(ShapePick(problem.key, *picks, *timed))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class HeldOut:
    group: str
    trained_on: tuple[str, ...]  # the groups the refit was fitted to
    refit: dict[str, float]
    shipped: Scores  # the shipped values on the held-out group's timed configs
    refitted: Scores  # the refit on the same
    picks: tuple[ShapePick, ...]  # one per held-out shape


@dataclasses.dataclass(frozen=True)
class Across:
    shipped: dict[str, float]  # the calibration file's values of the fitted constants
    held_out: tuple[HeldOut, ...]
    every_group: dict[str, float]  # the fit on every group: the values a calibration update would take
    every_group_scores: Scores  # that fit on all timed configs, which it was fitted to
    shipped_scores: Scores  # the shipped values on the same
    other_kernels: int  # timed configs of kernels the cost model does not estimate, left out


def across_groups(cal: calibration.Calibration, baselines: dict, names: tuple[str, ...] = ACROSS) -> Across:
    """Leave one group out (`model_groups`): fit `names` to the other groups' timed configs, then score
    the held-out group's configs under the refit beside the shipped values and compare the heuristic's
    picks on its shapes; and the fit to every group."""
    every_timed = timed_configs(baselines)
    timed = [t for t in every_timed if forward_kernel(t.problem)]
    estimates = Estimates(timed, {k: c["value"] for k, c in cal.constants.items()})
    label = model_groups([t.problem for t in timed])
    groups = np.array([label[t.problem] for t in timed])
    held_out = []
    for group in sorted(set(groups)):
        training, held = groups != group, groups == group
        refit = fit(names, estimates, training)
        problems = list(dict.fromkeys(t.problem for t in itertools.compress(timed, held)))
        held_out.append(
            HeldOut(
                group=group,
                trained_on=tuple(sorted(set(groups[training]))),
                refit=refit,
                shipped=scores(estimates, {}, held),
                refitted=scores(estimates, refit, held),
                picks=shape_picks(problems, refit, estimates),
            )
        )
    everything = np.ones(len(timed), dtype=bool)
    every_group = fit(names, estimates, everything)
    return Across(
        shipped={name: estimates.shipped[name] for name in names},
        held_out=tuple(held_out),
        every_group=every_group,
        every_group_scores=scores(estimates, every_group, everything),
        shipped_scores=scores(estimates, {}, everything),
        other_kernels=len(every_timed) - len(timed),
    )


def _ordered(s: Scores) -> str:
    return f"{s.ordered}/{s.pairs}" if s.pairs else "no pairs"


def _ms(seconds: float | None) -> str:
    return "not timed" if seconds is None else f"{seconds * 1e3:.4g} ms"


def _values(values: dict[str, float], shipped: dict[str, float]) -> str:
    """name=value, marked where the value sits at its grid's end."""
    out = []
    for name, value in values.items():
        ends = grid(name, shipped[name])
        bound = " (low bound)" if value == ends[0] else " (high bound)" if value == ends[-1] else ""
        out.append(f"{name}={value:.4g}{bound}")
    return ", ".join(out)


def _config_change(p: ShapePick) -> str:
    return ", ".join(f"{k} {p.shipped_pick[k]}->{v}" for k, v in p.pick.items() if p.shipped_pick.get(k) != v)


def across_report(across: Across) -> str:
    shapes = sum(len(h.picks) for h in across.held_out)
    lines = [
        f"Across shapes: {', '.join(across.shipped)} fitted to the order of configs timed on one shape "
        f"(pairs over {DISTINCT:g}x apart), one model's shapes left out at a time "
        f"({len(across.held_out)} groups, {shapes} shapes; {across.other_kernels} timed configs of kernels "
        "with cost models of their own, the weight gradient's, left out)."
    ]
    for h in across.held_out:
        changed = [p for p in h.picks if p.verdict != "same"]
        lines.append(
            f"{h.group} ({len(h.picks)} shapes): pairs ordered {_ordered(h.shipped)} shipped, "
            f"{_ordered(h.refitted)} refit; median error {h.shipped.error_factor:.3f}x shipped, "
            f"{h.refitted.error_factor:.3f}x refit; picks changed {len(changed)}/{len(h.picks)}"
        )
        lines.append(f"  refit on the other groups: {_values(h.refit, across.shipped)}")
        for p in changed:
            lines.append(
                f"  {p.shape}: {_config_change(p)}: {p.verdict}, measured {_ms(p.pick_s)} "
                f"(shipped pick {_ms(p.shipped_pick_s)})"
            )
    picks = [p for h in across.held_out for p in h.picks]
    verdicts = collections.Counter(p.verdict for p in picks)
    ordered = [sum(getattr(h, side).ordered for h in across.held_out) for side in ("shipped", "refitted")]
    pairs = sum(h.shipped.pairs for h in across.held_out)
    lines.append(
        f"Summary over held-out groups: pairs ordered {ordered[0]}/{pairs} shipped, {ordered[1]}/{pairs} "
        f"refit; picks changed {len(picks) - verdicts['same']}/{len(picks)}: {verdicts['better']} better, "
        f"{verdicts['worse']} worse, {verdicts['unknown']} unknown (a pick the baselines did not time)"
    )
    every, shipped = across.every_group_scores, across.shipped_scores
    lines.append(
        "Fitted on every group (in-sample, not a prediction; the values a calibration update would take): "
        f"{_values(across.every_group, across.shipped)}; shipped {_values(across.shipped, across.shipped)}; "
        f"pairs ordered {_ordered(every)} fitted, {_ordered(shipped)} shipped; median error "
        f"{every.error_factor:.3f}x fitted, {shipped.error_factor:.3f}x shipped"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baselines", type=Path, default=BASELINES)
    parser.add_argument("--json", type=Path, help="also write the rows and the across-shapes fit here")
    args = parser.parse_args(argv)
    cal, baselines = calibration.load(), json.loads(args.baselines.read_text())
    rows, single = leave_one_out(cal, baselines)
    print(report(rows, single))
    across = across_groups(cal, baselines)
    print()
    print(across_report(across))
    if args.json:
        payload = {
            "rows": [dataclasses.asdict(r) for r in rows],
            "single_shape": single,
            "across": dataclasses.asdict(across),
        }
        args.json.write_text(json.dumps(payload, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
