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
    """The job's JSON: every field of the spec, `WHERE` left empty, and each Hugging Face config named by
    its path (`--hf-config`) embedded as its JSON (hf_config.embedded): the worker that runs the job may
    not have the file."""
    data = spec.to_dict() | dict.fromkeys(WHERE)
    data["models"] = [_embedded(name) for name in data.get("models") or ()]
    return data


def _embedded(name: str) -> str:
    from moetune.tuner import hf_config

    if not name.startswith(hf_config.PREFIX):
        return name
    options, _, path = name.removeprefix(hf_config.PREFIX).partition(":")
    if path.startswith("{"):  # embedded already
        return name
    shards = dict(item.split("=", 1) for item in options.split(",") if "=" in item)
    return hf_config.embedded(path, tp=int(shards.get("tp", 1)), ep=int(shards.get("ep", 1)))


def from_request(data: Any, source: str) -> SweepSpec:
    """A sweep spec sent over the network as plain data (a sweep file's fields), checked like `moetune
    submit`'s. It may name no file of the server: models are shipped ones, routings are not FILE.npy, no
    MaxText config."""
    if isinstance(data, dict):
        given = sorted(name for name in WHERE if data.get(name) is not None)
        if given:
            raise ConfigInvalid(
                f"{source}: a job runs on its worker's database and cluster; drop {', '.join(given)}"
            )
        _check_models(data, source)
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


def _model_names(data: dict[str, Any], source: str) -> list[Any]:
    """Every model a request names, under `models` and the singular `model` together (SweepSpec.from_dict
    merges the two: checking one alone let the other through)."""
    names: list[Any] = []
    for key in ("models", "model"):
        value = data.get(key)
        if value is None:
            continue
        if isinstance(value, str):
            names.append(value)
        elif isinstance(value, list):
            names.extend(value)
        else:
            raise ConfigInvalid(f"{source}: {key} must be a list of shipped model names")
    return names


def _check_models(data: dict[str, Any], source: str) -> None:
    """Shipped model names only: a path or an `hf:` reference would make the server (or the worker) read
    a file the request names. The refusal names no file's contents: nothing is read to decide it."""
    from moetune.tuner.plan import shipped_model_names

    shipped = shipped_model_names()
    for name in _model_names(data, source):
        if isinstance(name, str) and name in shipped:
            continue
        shown = repr(name[:80]) if isinstance(name, str) else f"a {type(name).__name__}"
        if isinstance(name, str) and name.startswith("hf:"):
            why = (
                "an hf: reference names a file; submit it with `moetune submit --hf-config`, which embeds it"
            )
        else:
            why = f"a request names shipped models: {', '.join(shipped)}"
        raise ConfigInvalid(f"{source}: unknown model {shown}; {why}")


def of_job(job: Any) -> SweepSpec:
    """The spec of a stored job (moetune.db.jobs.JobRow)."""
    return SweepSpec.from_dict(job.spec, f"job {job.id}")
