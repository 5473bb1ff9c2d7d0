"""A sweep's outcome: per problem, the winner against the heuristic default and XLA's ragged_dot."""

from __future__ import annotations

import dataclasses
from typing import Any

from moetune.kernels.device import DeviceFingerprint
from moetune.tuner.durations import ms
from moetune.tuner.problem_run import Known, ProblemRun


@dataclasses.dataclass(frozen=True)
class ProblemOutcome:
    label: str
    problem_key: str
    skipped: str
    counts: dict[str, int]
    best: Known | None
    heuristic_s: float | None
    baseline_s: float | None
    winner_config: dict[str, Any] | None
    winner_s: float | None
    decision: str
    incomplete: bool = False  # no decision could be made (its finalists' re-timing failed twice)

    @property
    def speedup_vs_heuristic(self) -> float | None:
        return _ratio(self.heuristic_s, self.winner_s)

    @property
    def speedup_vs_baseline(self) -> float | None:
        return _ratio(self.baseline_s, self.winner_s)


def _ratio(slow: float | None, fast: float | None) -> float | None:
    return slow / fast if slow and fast else None


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
) -> SweepOutcome:
    """Each problem's result; `baseline` is the baseline's config when it was one of the candidates."""
    problems = []
    for run in runs:
        winner = None
        if run.phase != "skipped":
            winner = store.current_winner(
                fingerprint_hash=device.hash, backend=backend, problem_key=run.problem.key
            )
        baseline_s = (
            run.median_of(baseline) if baseline else (run.baseline.median_s if run.baseline else None)
        )
        problems.append(
            ProblemOutcome(
                label=run.label,
                problem_key=run.problem.key,
                skipped=run.skipped,
                counts=run.counts(sweep_id),
                best=run.best(),
                heuristic_s=run.median_of(run.heuristic),
                baseline_s=baseline_s,
                winner_config=winner.config if winner else None,
                winner_s=run.median_of(winner.config) if winner else None,
                decision=run.decision.reason if run.decision else "",
                incomplete=run.incomplete,
            )
        )
    return SweepOutcome(
        sweep_id, backend, device.device_kind, status, elapsed_s, recorded, problems, compile_target
    )


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def outcome_rows(outcome: SweepOutcome) -> list[dict[str, Any]]:
    rows = []
    for p in outcome.problems:
        counts = p.counts
        trials = ", ".join(f"{v} {k}" for k, v in sorted(counts.items(), key=lambda kv: kv[0] != "ok"))
        config = "" if p.winner_config is None else ",".join(f"{k}={v}" for k, v in p.winner_config.items())
        rows.append(
            {
                "problem": p.label,
                "trials": p.skipped and f"skipped: {p.skipped}" or trials,
                "winner_ms": ms(p.winner_s),
                "heuristic_ms": ms(p.heuristic_s),
                "xla_ms": ms(p.baseline_s),
                "vs_heuristic": _x(p.speedup_vs_heuristic),
                "vs_xla": _x(p.speedup_vs_baseline),
                "winner_config": config,
                "decision": p.decision,
            }
        )
    return rows
