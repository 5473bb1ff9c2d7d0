"""`moetune export-optuna`: a sweep's studies (tuner/optuna_study.py) written to an Optuna storage, one
study per problem, named `<prefix>/<problem key>` (prefix `sweep<id>` unless given).

All or nothing: names already in the storage are refused before anything is written, and the studies
written so far are deleted again when a later one fails.
"""

from __future__ import annotations

from typing import Any

import optuna

from moetune.db.errors import DatabaseError, InvalidRecord
from moetune.db.urls import masked, parse, scrub
from moetune.tuner.optuna_study import ProblemStudy, sweep_studies


def study_name(prefix: str, study: ProblemStudy) -> str:
    return f"{prefix}/{study.problem.key}"


def export(store: Any, sweep_id: int, storage_url: str, prefix: str | None = None) -> list[str]:
    """Write sweep `sweep_id` of `store` into the Optuna storage at `storage_url`; the study names."""
    import sqlalchemy.exc

    sweep, studies = sweep_studies(store, sweep_id)
    if not studies:
        raise InvalidRecord(
            f"sweep {sweep_id} has no trials of its backend {sweep.backend}: nothing to export"
        )
    prefix = prefix or f"sweep{sweep_id}"
    names = [study_name(prefix, s) for s in studies]
    storage = _open(storage_url)
    try:
        taken = sorted(set(names) & set(optuna.get_all_study_names(storage)))
        if taken:
            raise InvalidRecord(
                f"{masked(storage_url)} already holds study {taken[0]!r}; choose another --study-name "
                "or delete it (optuna delete-study)"
            )
        written: list[str] = []
        try:
            for name, study in zip(names, studies, strict=True):
                created = optuna.create_study(storage=storage, study_name=name, direction="minimize")
                written.append(name)
                for key, value in _study_attrs(sweep, study).items():
                    created.set_user_attr(key, value)
                created.add_trials(study.trials)
        except BaseException:
            for name in written:  # all or nothing; the failure itself goes on up
                optuna.delete_study(study_name=name, storage=storage)
            raise
    except (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError) as e:
        raise DatabaseError(
            f"optuna storage {masked(storage_url)}: {scrub(str(e), parse(storage_url))}"
        ) from e
    finally:
        storage.engine.dispose()
    return names


def _study_attrs(sweep: Any, study: ProblemStudy) -> dict[str, Any]:
    return {
        "moetune_sweep_id": sweep.id,
        "backend": sweep.backend,
        "strategy": sweep.strategy,
        "device_kind": (sweep.spec.get("device") or {}).get("device_kind"),
        "problem": study.problem.key,
        "objective": "median kernel time in seconds",
    }


def _open(url: str) -> optuna.storages.RDBStorage:
    """The storage (its tables are created when the database is new); one-line DatabaseError otherwise."""
    import sqlalchemy.exc

    parsed = parse(url)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.storages.RDBStorage(url)
    # RuntimeError: a storage whose Optuna schema is older or newer than this Optuna's.
    except (sqlalchemy.exc.SQLAlchemyError, ImportError, RuntimeError) as e:
        raise DatabaseError(f"optuna storage {masked(parsed)}: {scrub(str(e), parsed)}") from e
