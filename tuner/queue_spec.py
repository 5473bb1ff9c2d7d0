"""What a queued job holds: a SweepSpec checked as `moetune tune` checks one before anything is written,
without where it runs (the worker's database and Ray cluster; a database URL may hold a password)."""

from __future__ import annotations

from typing import Any

from moetune.kernels.errors import ConfigInvalid
from moetune.tuner.spec import SweepSpec
from moetune.tuner.sweep_setup import check_before_opening

# Set by the worker that runs the job, never by the job.
WHERE = ("db", "ray_address")


def stored(spec: SweepSpec) -> dict[str, Any]:
    """The job's JSON: every field of the spec, `WHERE` left empty."""
    return spec.to_dict() | dict.fromkeys(WHERE)


def from_request(data: Any, source: str) -> SweepSpec:
    """A sweep spec sent over the network as plain data (a sweep file's fields), checked like `moetune
    submit`'s. It may name no file of the server: models are shipped ones, routings are not FILE.npy, no
    MaxText config."""
    from moetune.tuner.plan import shipped_model_names

    if isinstance(data, dict):
        given = sorted(name for name in WHERE if data.get(name) is not None)
        if given:
            raise ConfigInvalid(
                f"{source}: a job runs on its worker's database and cluster; drop {', '.join(given)}"
            )
        models = data.get("models", data.get("model", []))
        unknown = [
            m for m in ([models] if isinstance(models, str) else models) if m not in shipped_model_names()
        ]
        if unknown:
            raise ConfigInvalid(
                f"{source}: unknown models {', '.join(map(repr, unknown))}; a request names shipped models: "
                f"{', '.join(shipped_model_names())}"
            )
        if data.get("maxtext") is not None:
            raise ConfigInvalid(
                f"{source}: a request cannot name a MaxText config file of the server; submit it with "
                "`moetune submit --maxtext-config` where the file is"
            )
        routing = data.get("routing", "")
        parts = (
            routing.split(",") if isinstance(routing, str) else routing if isinstance(routing, list) else []
        )
        if any(str(part).strip().endswith(".npy") for part in parts):
            raise ConfigInvalid(f"{source}: a request cannot name a routing file; use balanced or zipf:S")
    spec = SweepSpec.from_dict(data, source)
    check_before_opening(spec)
    return spec


def of_job(job: Any) -> SweepSpec:
    """The spec of a stored job (moetune.db.jobs.JobRow)."""
    return SweepSpec.from_dict(job.spec, f"job {job.id}")
