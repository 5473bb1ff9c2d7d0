"""A sweep's trials as Optuna trials, one study per problem: the in-memory study behind the report's
parameter importance, and `moetune export-optuna`, which writes them to an Optuna storage (an RDB URL
that optuna-dashboard opens).

Only the recorded trials are read, so a sweep of any strategy (grid, random, tpe) exports alike.
Parameters keep their values (tuner/optuna_space.py, unranked). The domains are the backend's space
for the problem, narrowed by the sweep's `space:`, and widened by any value a trial holds that the
space no longer has (a sweep recorded under an older space), so that every stored trial is placed as
it ran; a backend that cannot be loaded here leaves the values the trials hold. The value is the
median seconds (minimised); ok trials are COMPLETE, all others FAIL with their status and error text
as user attributes.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import MoetuneError
from moetune.kernels.problem import Problem
from moetune.tuner.optuna_space import OptunaSpace, is_numeric
from moetune.tuner.tasks import OK

# PED-ANOVA (Optuna's default evaluator) contrasts the fastest 10% of the trials, at least two, with all
# of them: below five ok trials the two sets nearly coincide and the importances say nothing.
MIN_IMPORTANCE_TRIALS = 5
OPTUNA_CHOICE = (bool, int, float, str, type(None))


@dataclasses.dataclass(frozen=True)
class ProblemStudy:
    problem: Problem
    space: OptunaSpace
    trials: list[optuna.trial.FrozenTrial]  # in the order the sweep recorded them


def _widened(domains: Mapping[str, tuple[Any, ...]], configs: Sequence[dict[str, Any]]) -> dict[str, tuple]:
    """`domains` plus every value the configs hold outside them; numbers stay in order."""
    widened = {name: tuple(values) for name, values in domains.items()}
    for config in configs:
        for name, value in config.items():
            values = widened.get(name, ())
            if not isinstance(value, OPTUNA_CHOICE) or value in values:
                continue
            values += (value,)
            widened[name] = tuple(sorted(values)) if is_numeric(values) else values
    return widened


def _space_domains(
    backend: str, problem: Problem, device: DeviceFingerprint | None, narrowed: Mapping[str, Any] | None
) -> Mapping[str, tuple[Any, ...]]:
    """The sweep's domains for the problem, or none when the backend is not available here or declines
    the problem (NotImplementedError, Unsupported among them)."""
    if device is None:
        return {}
    from moetune.kernels import registry

    try:
        return registry.get(backend).search_space(problem, device).restricted(narrowed).domains
    except (MoetuneError, ImportError, NotImplementedError):
        return {}


def problem_study(
    backend: str,
    problem: Problem,
    device: DeviceFingerprint | None,
    narrowed: Mapping[str, Any] | None,
    rows: Sequence[Any],
    recorded_at: datetime.datetime,
) -> ProblemStudy:
    """The problem's trial rows (TrialRow, the sweep's backend only) as Optuna trials; `recorded_at`
    stands in for a row's missing start and end times."""
    rows = sorted(rows, key=lambda r: r.id)
    domains = _widened(_space_domains(backend, problem, device, narrowed), [r.config for r in rows])
    space = OptunaSpace(domains, ranked=False)
    trials = [_frozen(number, row, space, recorded_at) for number, row in enumerate(rows)]
    return ProblemStudy(problem, space, trials)


def _frozen(
    number: int, row: Any, space: OptunaSpace, recorded_at: datetime.datetime
) -> optuna.trial.FrozenTrial:
    # A value Optuna cannot hold as a choice (a list) stays in the `config` attribute only.
    params = space.encode({k: v for k, v in row.config.items() if isinstance(v, OPTUNA_CHOICE)}, partial=True)
    timed = row.status == OK and row.median_s is not None
    attrs: dict[str, Any] = {"moetune_trial_id": row.id, "status": row.status, "config": row.config}
    if row.status != OK:
        attrs["error"] = row.error
    elif not timed:
        attrs["error"] = "compiled only, never timed"
    start = row.started_at or row.finished_at or recorded_at
    return optuna.trial.FrozenTrial(
        number=number,
        state=optuna.trial.TrialState.COMPLETE if timed else optuna.trial.TrialState.FAIL,
        value=row.median_s if timed else None,
        datetime_start=start,
        datetime_complete=row.finished_at or start,
        params=params,
        distributions={name: space.distributions[name] for name in params},
        user_attrs=attrs,
        system_attrs={},
        intermediate_values={},
        trial_id=number,
    )


def sweep_studies(store: Any, sweep_id: int) -> tuple[Any, list[ProblemStudy]]:
    """The sweep row and one study per problem the sweep's backend has trials for, by problem key."""
    sweep = store.get_sweep(sweep_id)
    by_problem: dict[str, list[Any]] = collections.defaultdict(list)
    for row in store.trials(sweep_id=sweep_id, backend=sweep.backend):
        by_problem[row.problem.key].append(row)
    device = sweep_device(sweep.spec)
    narrowed = (sweep.spec.get("spec") or {}).get("space")
    studies = [
        problem_study(sweep.backend, rows[0].problem, device, narrowed, rows, sweep.created_at)
        for _, rows in sorted(by_problem.items())
    ]
    return sweep, studies


def sweep_device(spec: Mapping[str, Any]) -> DeviceFingerprint | None:
    device = spec.get("device")
    return DeviceFingerprint.from_dict(device) if isinstance(device, dict) else None


def importances(study: ProblemStudy) -> dict[str, float] | None:
    """Optuna's parameter importances over the ok trials; None when there are too few of them or no
    parameter took two values."""
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    varied = [name for name in study.space.domains if len({repr(t.params.get(name)) for t in complete}) > 1]
    if len(complete) < MIN_IMPORTANCE_TRIALS or not varied:
        return None
    memory = in_memory(study)
    with warnings.catch_warnings():
        # The evaluator warns about sparse regions of the space; the report states the trial count.
        warnings.simplefilter("ignore")
        return optuna.importance.get_param_importances(memory, params=varied)


def in_memory(study: ProblemStudy) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    memory = optuna.create_study(direction="minimize")
    memory.add_trials(study.trials)
    return memory
