"""`moetune submit`: put a sweep in the tuning queue (moetune.db.jobs) for `moetune worker` to run.

It takes tune's own flags (the signature is tune's, less those that say how or where this process would
run it) and checks the spec with tune's own code before anything is written, so a job that is queued is
one that `moetune tune` would have started.
"""

from __future__ import annotations

import getpass
import inspect
from typing import Annotated, Any

import typer

from moetune.cli import app, tune
from moetune.cli.common import check_range, fail, json_text
from moetune.cli.db_commands import opened_store, say
from moetune.kernels.errors import MoetuneError
from moetune.kernels.typed_fields import INT32_MAX

# tune's flags that choose how this process runs a sweep: a worker decides those.
NOT_QUEUED = ("ray_address", "resume", "dry_run", "inline", "force", "as_json")
DEVICE_KIND_LENGTH = 128  # db/models.py Job.device_kind


def _options(
    priority: Annotated[
        int, typer.Option("--priority", help="Higher runs first; equal priorities run oldest first.")
    ] = 0,
    device_kind: Annotated[
        str | None,
        typer.Option(
            "--device-kind",
            help="Only a worker on this device kind (jax device_kind, e.g. 'NVIDIA H200') runs it.",
            show_default="any worker",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the job as JSON.")] = False,
) -> None:
    """submit's own options; only its signature is used."""


def submit(**params: Any) -> None:
    """Queue a sweep (a sweep file or tune's flags) for `moetune worker`; prints the job id.

    The spec is checked as `moetune tune` checks it; bad input is one line, exit 2, nothing written."""
    priority, device_kind, as_json = params.pop("priority"), params.pop("device_kind"), params.pop("as_json")
    check_range("--priority", priority, low=-INT32_MAX)
    if device_kind is not None and not 0 < len(device_kind) <= DEVICE_KIND_LENGTH:
        fail(f"--device-kind must be 1 to {DEVICE_KIND_LENGTH} characters")
    from moetune.tuner import queue_spec

    try:
        spec, sweep_file = tune.checked_spec(params["sweep"], tune.sweep_flags(params))
    except MoetuneError as e:
        fail(str(e))
    with opened_store(params["db"]) as store:
        job_id = store.submit_job(
            queue_spec.stored(spec),
            sweep_file=sweep_file,
            device_kind=device_kind,
            priority=priority,
            submitted_by=_user(),
        )
        job = store.get_job(job_id)
    if as_json:
        typer.echo(json_text(job.to_json(), indent=1))
    else:
        say(f"job {job_id} queued (priority {priority}); workers run it: moetune worker")


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


def _signature() -> inspect.Signature:
    """tune's parameters less NOT_QUEUED, then submit's own."""
    shared = [
        p for p in inspect.signature(tune.tune, eval_str=True).parameters.values() if p.name not in NOT_QUEUED
    ]
    own = inspect.signature(_options, eval_str=True).parameters.values()
    return inspect.Signature([*shared, *own])


submit.__signature__ = _signature()  # what typer reads the options from
app.command("submit")(submit)
