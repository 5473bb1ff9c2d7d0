"""A sweep's outcome: per problem, the winner as decided against the heuristic default and XLA's
ragged_dot (tuner/decided.py says which numbers are compared), as JSON data and as table cells.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.problem import Problem
from moetune.tuner import config_diff, decided
from moetune.tuner.decided import Compared, WinnerView
from moetune.tuner.durations import Unit, unit_for
from moetune.tuner.problem_run import Known, ProblemRun


@dataclasses.dataclass(frozen=True)
class ProblemOutcome:
    label: str
    problem: Problem
    tokens: int | None  # T, when a model planned the problem (m = T * top_k)
    skipped: str
    counts: dict[str, int]
    best: Known | None
    heuristic: dict[str, Any] | None  # the heuristic default's config
    heuristic_s: float | None  # its sweep median
    baseline_s: float | None  # XLA's ragged_dot, its sweep median
    baseline: dict[str, Any] | None  # the baseline's config when it was one of the candidates
    winner: WinnerView | None
    decision: str  # this sweep's decision, in words
    incomplete: bool = False  # no decision could be made (its finalists' re-timing failed twice)

    @property
    def problem_key(self) -> str:
        return self.problem.key

    @property
    def winner_config(self) -> dict[str, Any] | None:
        return self.winner.config if self.winner else None

    @property
    def winner_s(self) -> float | None:
        """The winner's time as decided (re-timed), or its recorded median."""
        return self.winner.time.seconds if self.winner else None

    @property
    def vs_heuristic(self) -> Compared | None:
        return self.winner.versus(self.heuristic, self.heuristic_s) if self.winner else None

    @property
    def vs_baseline(self) -> Compared | None:
        return self.winner.versus(self.baseline, self.baseline_s) if self.winner else None


@dataclasses.dataclass(frozen=True)
class SweepOutcome:
    sweep_id: int
    backend: str
    device_kind: str
    status: str
    elapsed_s: float
    trials: int
    problems: list[ProblemOutcome]
    compile_target: str | None = None  # set for a compile-only sweep: nothing was timed

    @property
    def incomplete(self) -> list[str]:
        """The problems left without a decision (the sweep's status is then "incomplete")."""
        return [p.label for p in self.problems if p.incomplete]


def this_sweeps_decision(run: ProblemRun, sweep_id: int | None, rounds: int) -> dict[str, Any] | None:
    """The problem's decision of this sweep as data (None before it settled, or without re-timing)."""
    if run.decision is None:
        return None
    return decided.record(run.decision, sweep_id=sweep_id, rounds=rounds, heuristic=run.heuristic)


def outcome(
    store: Any,
    runs: list[ProblemRun],
    *,
    sweep_id: int,
    device: DeviceFingerprint,
    backend: str,
    status: str,
    elapsed_s: float,
    recorded: int,
    baseline: dict[str, Any] | None,
    compile_target: str | None = None,
    rounds: int = 0,
) -> SweepOutcome:
    """Each problem's result; `baseline` is the baseline's config when it was one of the candidates;
    `rounds` those of the re-timing."""
    problems = []
    for run in runs:
        winner = None
        if run.phase != "skipped":
            row = store.current_winner(
                fingerprint_hash=device.hash, backend=backend, problem_key=run.problem.key
            )
            if row is not None:
                # This sweep's re-timing when it included the winner (a winner kept is re-timed too),
                # else the decision stored when it was promoted.
                decisions = (this_sweeps_decision(run, sweep_id, rounds), row.decision)
                winner = WinnerView.of(row.trial_id, row.config, row.median_s, decisions)
        baseline_s = (
            run.median_of(baseline) if baseline else (run.baseline.median_s if run.baseline else None)
        )
        problems.append(
            ProblemOutcome(
                label=run.label,
                problem=run.problem,
                tokens=run.planned.tokens,
                skipped=run.skipped,
                counts=run.counts(sweep_id),
                best=run.best(),
                heuristic=run.heuristic,
                heuristic_s=run.median_of(run.heuristic),
                baseline_s=baseline_s,
                baseline=baseline,
                winner=winner,
                decision=run.decision.reason if run.decision else "",
                incomplete=run.incomplete,
            )
        )
    return SweepOutcome(
        sweep_id, backend, device.device_kind, status, elapsed_s, recorded, problems, compile_target
    )


def problem_fields(problem: Problem, tokens: int | None) -> dict[str, Any]:
    """A problem in JSON: its key and dims, T beside m (None: not known)."""
    p = problem
    return {"key": p.key, "op": p.op, "tokens": tokens, "m": p.m, "k": p.k, "n": p.n, "g": p.g}


def outcome_json(outcome: SweepOutcome) -> list[dict[str, Any]]:
    """Per problem, numbers as numbers and configs as objects."""
    rows = []
    for p in outcome.problems:
        winner = p.winner.to_dict() if p.winner else None
        if winner is not None:
            winner["config_diff"] = config_diff.changed(outcome.backend, p.winner.config)
        heuristic = p.vs_heuristic
        baseline = p.vs_baseline
        rows.append(
            {
                "problem": p.label,
                **problem_fields(p.problem, p.tokens),
                "skipped": p.skipped or None,
                "trials": dict(p.counts),
                "incomplete": p.incomplete,
                "winner": winner,
                "heuristic": None if heuristic is None else {"config": p.heuristic} | heuristic.to_dict(),
                "xla": None if baseline is None else baseline.to_dict(),
                "decided_by": p.decision,
                "decision": p.winner.decision if p.winner else None,
            }
        )
    return rows


def outcome_unit(outcome: SweepOutcome) -> Unit:
    times = []
    for p in outcome.problems:
        times += [p.winner_s, p.winner.sweep_s if p.winner else None]
        times += [c.time.seconds for c in (p.vs_heuristic, p.vs_baseline) if c is not None]
    return unit_for(times)


def _compared(compared: Compared | None, unit: Unit) -> str:
    return "-" if compared is None else compared.cell(unit)


def _ratio(compared: Compared | None) -> str:
    return "-" if compared is None else compared.ratio_cell()


def trials_cell(p: ProblemOutcome) -> str:
    if p.skipped:
        return f"skipped: {p.skipped}"
    return ", ".join(f"{v} {k}" for k, v in sorted(p.counts.items(), key=lambda kv: kv[0] != "ok"))


def outcome_cells(outcome: SweepOutcome, unit: Unit, *, tokens: bool) -> list[dict[str, str]]:
    """The rows of tune's final table; the caller names `unit` in the headers."""
    rows = []
    for p in outcome.problems:
        row = {"problem": p.label, "op": p.problem.op}
        if tokens:
            row["T"] = "-" if p.tokens is None else str(p.tokens)
        row |= {
            "m": str(p.problem.m),
            "trials": trials_cell(p),
            f"winner {unit.name}": p.winner.cell(unit) if p.winner else "-",
            f"its sweep {unit.name}": unit.format(p.winner.sweep_s) if p.winner else "-",
            f"heuristic {unit.name}": _compared(p.vs_heuristic, unit),
            f"xla {unit.name}": _compared(p.vs_baseline, unit),
            "vs heuristic": _ratio(p.vs_heuristic),
            "vs xla": _ratio(p.vs_baseline),
            "winner config (not default)": config_diff.text(outcome.backend, p.winner_config),
            "decided by": p.decision,
        }
        rows.append(row)
    return rows


# --- the live table: best so far while a problem searches, the winner as decided once it settled ----


@dataclasses.dataclass(frozen=True)
class LiveRow:
    label: str
    backend: str
    problem: Problem
    tokens: int | None
    state: str  # searching | re-timing | decided | settled | skipped
    time: decided.Timed | None  # the decided winner's (re-timed), else the best sweep median so far
    heuristic: Compared | None
    config: dict[str, Any] | None


_STATES = {"search": "searching", "retime_wanted": "re-timing", "retime": "re-timing", "skipped": "skipped"}


def live_row(run: ProblemRun, sweep_id: int | None, rounds: int) -> LiveRow:
    """What the live table shows of one problem: the winner with the medians that decided it as soon as
    its re-timing did, never a single median beside it."""
    base = dict(label=run.label, backend=run.backend.name, problem=run.problem, tokens=run.planned.tokens)
    heuristic_s = run.median_of(run.heuristic)
    record = this_sweeps_decision(run, sweep_id, rounds) if run.phase in ("settled", "done") else None
    chosen = run.decision and (
        run.decision.promote or next((f for f in run.decision.finalists if f.is_winner), None)
    )
    if record is not None and chosen:
        view = WinnerView.of(chosen.trial_id, chosen.config, run.median_of(chosen.config), [record])
        if view.decision is not None:
            return LiveRow(
                **base,
                state="decided",
                time=view.time,
                heuristic=view.versus(run.heuristic, heuristic_s),
                config=view.config,
            )
    top = run.best()
    state = _STATES.get(run.phase, "settled")
    if top is None:
        return LiveRow(**base, state=state, time=None, heuristic=None, config=None)
    view = WinnerView(top.trial_id, top.config, top.median_s, None)
    versus = view.versus(run.heuristic, heuristic_s)
    return LiveRow(
        **base,
        state=state,
        time=decided.Timed(top.median_s, decided.SWEEP),
        heuristic=versus,
        config=top.config,
    )


def live_cells(rows: list[LiveRow]) -> list[dict[str, str]]:
    """The live table's rows, one time unit for all of them (named in the headers)."""
    unit = unit_for(
        [t for r in rows for t in (r.time and r.time.seconds, r.heuristic and r.heuristic.time.seconds)]
    )
    cells = []
    for r in rows:
        kind = "" if r.time is None else (" re-timed" if r.time.source == decided.RETIMED else " sweep")
        cells.append(
            {
                "problem": r.label,
                "op": r.problem.op,
                "T": "-" if r.tokens is None else str(r.tokens),
                "m": str(r.problem.m),
                "state": r.state,
                f"winner / best {unit.name}": "-" if r.time is None else unit.format(r.time.seconds) + kind,
                f"heuristic {unit.name}": _compared(r.heuristic, unit),
                "vs heuristic": _ratio(r.heuristic),
                "config (not default)": config_diff.text(r.backend, r.config),
            }
        )
    return cells
