"""`moetune doctor`: what this machine has, as moetune sees it, and what is wrong.

It reports versions, JAX's devices, the device fingerprint, the database (URL with the password
masked, schema revision) without creating or migrating it, whether Ray imports, and which backends
can run here. A database that cannot be used ends the report with one error line and exit code 2.
"""

from __future__ import annotations

import importlib.metadata
import platform
from typing import Any

import typer

from moetune.cli import app
from moetune.cli.common import DbOption, emit, fail, json_text
from moetune.cli.db_commands import JsonOption
from moetune.kernels.errors import MoetuneError

PACKAGES = ("jax", "jaxlib", "ray", "optuna", "sqlalchemy", "alembic", "psycopg")


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _jax_devices() -> str:
    import jax

    return ", ".join(f"{d.platform}:{d.device_kind}" for d in jax.devices())


def _ray() -> str:
    try:
        import ray
    except Exception as e:  # the report shows any import failure, whatever its type
        return f"not importable: {type(e).__name__}: {e}"
    return f"importable ({ray.__version__})"


def _database(db: str | None) -> tuple[dict[str, Any], str | None]:
    """The database's facts and the error that makes it unusable (None when usable)."""
    from moetune.db import Store, urls

    try:
        store = Store(db)
    except MoetuneError as e:
        return {"url": urls.masked(urls.resolve(db)), "error": str(e)}, str(e)
    try:
        state = store.schema_state()
    except MoetuneError as e:
        return {"url": store.url, "error": str(e)}, str(e)
    finally:
        store.close()
    info = {"url": state.url, "revision": state.revision, "head": state.head, "status": state.status}
    return info, state.problem()


def _attempt(fn: Any) -> Any:
    try:
        return fn()
    except Exception as e:  # doctor reports failures instead of stopping at the first one
        return f"error: {type(e).__name__}: {e}"


@app.command()
def doctor(db: DbOption = None, as_json: JsonOption = False) -> None:
    """Check this machine: versions, JAX devices, device fingerprint, database, Ray and backends."""
    from moetune.kernels import registry
    from moetune.kernels.device import current_fingerprint

    fingerprint = _attempt(current_fingerprint)
    backends: dict[str, str | None] | str = (
        _attempt(lambda: registry.available(fingerprint)) if not isinstance(fingerprint, str) else fingerprint
    )
    database, problem = _database(db)
    report = {
        "versions": {"python": platform.python_version(), **{p: _version(p) for p in PACKAGES}},
        "jax_devices": _attempt(_jax_devices),
        "fingerprint": fingerprint if isinstance(fingerprint, str) else fingerprint.to_dict(),
        "fingerprint_hash": "" if isinstance(fingerprint, str) else fingerprint.hash,
        "database": database,
        "ray": _ray(),
        "backends": backends,
    }
    if as_json:
        typer.echo(json_text(report, indent=1, sort_keys=True))
    else:
        emit(_rows(report), as_json=False, title="moetune doctor")
    if problem is not None:
        fail(problem)


def _rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    rows = [{"check": name, "value": version} for name, version in report["versions"].items()]
    rows.append({"check": "jax devices", "value": report["jax_devices"]})
    fingerprint = report["fingerprint"]
    if isinstance(fingerprint, dict):
        rows += [{"check": f"fingerprint.{k}", "value": v} for k, v in fingerprint.items()]
    else:
        rows.append({"check": "fingerprint", "value": fingerprint})
    rows.append({"check": "fingerprint hash", "value": report["fingerprint_hash"]})
    rows += [{"check": f"database {k}", "value": v} for k, v in report["database"].items()]
    rows.append({"check": "ray", "value": report["ray"]})
    backends = report["backends"]
    if isinstance(backends, dict):
        if not backends:
            rows.append({"check": "backends", "value": "none registered"})
        for name, reason in backends.items():
            rows.append({"check": f"backend {name}", "value": "available" if reason is None else reason})
    else:
        rows.append({"check": "backends", "value": backends})
    return rows
