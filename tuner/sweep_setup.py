"""Turning a SweepSpec into a runnable sweep: its problems, its backend, its executor, its sweep row.

Shared by `moetune tune` and `moetune bench tuner`; the CLI modules only parse flags and print.
"""

from __future__ import annotations

import getpass
import os
import socket
from collections.abc import Callable
from typing import Any

from moetune.kernels import registry
from moetune.kernels.backend import Backend
from moetune.kernels.device import DeviceFingerprint, compile_only_device
from moetune.kernels.errors import ConfigInvalid, MoetuneError, Unsupported
from moetune.tuner import resolved
from moetune.tuner.executors import Executor, InlineExecutor, WorkerActivity
from moetune.tuner.plan import (
    PlannedProblem,
    as_fp8,
    decode_block_problems,
    dispatched_on,
    load_model,
    parse_problem,
    with_backward,
)
from moetune.tuner.spec import SweepSpec


def model_problems(spec: SweepSpec) -> list[PlannedProblem]:
    """The problems of the spec's models and single problems (those that need no device or database)."""
    planned: list[PlannedProblem] = []
    blocks: list[PlannedProblem] = []
    for name in spec.models:
        model = load_model(name)
        if spec.token_buckets:
            model = model.with_buckets(spec.token_buckets)
        planned += model.problems()
        if spec.decode_block:
            blocks += decode_block_problems(model)
    if spec.fp8 != "none":
        planned, blocks = as_fp8(planned, spec.fp8), as_fp8(blocks, spec.fp8)
    if spec.decode_block and not blocks:
        raise ConfigInvalid(
            "decode_block: no model here runs the fused decode block (SwiGLU experts of one 16- or 32-bit "
            "dtype, whole layers: ep=1, a token bucket of at most 32 tokens)"
        )
    planned += blocks
    planned += [parse_problem(text) for text in spec.problems]
    return planned


def maxtext_problems(spec: SweepSpec) -> list[PlannedProblem]:
    """The problems of the spec's MaxText config, backward included where its workloads train (so
    `with_backward` does not apply to them); traced once per process."""
    if spec.maxtext is None:
        return []
    from moetune.integrations.maxtext.problems import Target, planned_problems

    traced = planned_problems(Target.from_dict(spec.maxtext, "maxtext"))
    return [PlannedProblem(t.problem, t.label, t.tokens, t.filled_rows) for t in traced]


def store_problems(
    spec: SweepSpec, store: Any, backend: Backend, device: DeviceFingerprint
) -> list[PlannedProblem]:
    """The problems dispatch missed (--misses) and those whose winner is stale (--stale) on `device`.

    Either is left out once it has a current winner: tuned on this device with this kernel source.
    """
    source_hash = backend.source_hash()

    def tuned(problem: Any) -> bool:
        key = dict(fingerprint_hash=device.hash, backend=backend.name, source_hash=source_hash)
        return resolved.tuned(store, **key, problem_key=problem.key)

    planned: list[PlannedProblem] = []
    if spec.misses:
        for miss in store.misses(device_kind=device.device_kind, backend=backend.name):
            if not tuned(miss.problem):
                planned.append(PlannedProblem(miss.problem, f"miss x{miss.count} {_short(miss.problem)}"))
    if spec.stale:
        for winner in store.winners(device_kind=device.device_kind, backend=backend.name):
            changed = [
                what
                for what, stale in (
                    ("device", winner.fingerprint_hash != device.hash),
                    ("kernel", winner.source_hash != source_hash),
                )
                if stale
            ]
            if changed and not tuned(winner.problem):
                label = f"stale ({'+'.join(changed)}) {_short(winner.problem)}"
                planned.append(PlannedProblem(winner.problem, label))
    return planned


def _short(problem: Any) -> str:
    return f"m={problem.m},k={problem.k},n={problem.n},g={problem.g}"


class NothingToTune(MoetuneError):
    """--misses / --stale found nothing: every such problem has a current winner. Not an error."""


def resolve_problems(
    spec: SweepSpec, store: Any, backend: Backend, device: DeviceFingerprint
) -> list[PlannedProblem]:
    requested = dispatched_on(model_problems(spec), backend)
    if spec.with_backward:  # the backward of the GEMMs as the backend runs them (fused or not)
        requested = with_backward(requested)
    requested += maxtext_problems(spec)
    planned = dispatched_on(requested + store_problems(spec, store, backend, device), backend)
    check_fits(planned, device)  # a compile-only stand-in has no memory_bytes: the fixed cap alone
    if not planned and (spec.misses or spec.stale) and not (spec.models or spec.problems or spec.maxtext):
        asked = " or ".join(name for name, on in (("missed", spec.misses), ("stale", spec.stale)) if on)
        raise NothingToTune(
            f"nothing {asked} on {device.device_kind} for backend {backend.name}: every winner is current"
        )
    if not planned:
        raise ConfigInvalid(
            "nothing to tune: give --model, --problem, --maxtext-config, --misses or --stale (or a sweep "
            "file that names them)"
        )
    return planned


# The largest problem a sweep takes (docs/tuning.md, "Limits"). Every routing draw is G group sizes, drawn
# by the driver and kept in the sweep's row, for each routing and verification draw; a tuned MoE has at
# most a few hundred experts. A worker holds a problem's operands and output at once on one device, and
# no accelerator holds a tebibyte; the device's own memory is checked once the workers report it.
MAX_EXPERTS = 1 << 16
MAX_OPERAND_BYTES = 1 << 40


def check_fits(planned: list[PlannedProblem], device: DeviceFingerprint | None = None) -> None:
    """Refuse a problem whose routing draws or operands cannot fit: G past MAX_EXPERTS, operands and output
    past MAX_OPERAND_BYTES, or (given the workers' `device`) past its memory."""
    for item in planned:
        problem = item.problem
        if problem.g > MAX_EXPERTS:
            raise ConfigInvalid(
                f"{item.label}: g={problem.g} experts is past the limit of {MAX_EXPERTS} (every routing draw "
                "holds one group size per expert)"
            )
        size = problem.bytes_touched
        limit, where = MAX_OPERAND_BYTES, "the limit of"
        if device is not None and device.memory_bytes and device.memory_bytes < limit:
            limit, where = device.memory_bytes, f"the memory of {device.device_kind},"
        if size > limit:
            raise ConfigInvalid(
                f"{item.label}: its operands and output take {_gib(size)} GiB, past {where} {_gib(limit)} GiB"
            )


def _gib(size: int) -> str:
    return f"{size / (1 << 30):,.1f}"


def check_workers(spec: SweepSpec, cpus: int, where: str) -> None:
    """--workers above the cluster's CPUs would wait forever for workers Ray cannot place (each holds one
    CPU): refused before the cluster starts (this machine's CPUs) or, for a cluster joined, before any
    worker or row."""
    if spec.workers is not None and spec.workers > cpus:
        raise ConfigInvalid(f"--workers {spec.workers} is more than the {cpus} CPUs of {where}")


def check_local_workers(spec: SweepSpec) -> None:
    """check_workers for the local cluster a sweep without --ray-address starts (one CPU per CPU here)."""
    if spec.ray_address is None:
        check_workers(spec, len(os.sched_getaffinity(0)), "this machine (the local Ray cluster's)")


def check_before_opening(spec: SweepSpec) -> None:
    """What needs neither the workers' device nor the database, checked before either is touched, so
    that a bad argument opens no store, creates no file and starts no Ray cluster."""
    if spec.backend != "auto":
        registry.get(spec.backend)  # UnknownBackend names the registered ones
    if spec.compile_only:
        resolve_target(spec, None)  # a compile-only target needs no device
    requested = model_problems(spec)  # loads every model file
    if spec.with_backward:
        with_backward(requested)  # an op without a gradient is refused here
    requested += maxtext_problems(spec)  # traces the MaxText config: MaxText's refusals surface here
    check_fits(requested)
    if not requested and not (spec.misses or spec.stale):
        raise ConfigInvalid(
            "nothing to tune: give --model, --problem, --maxtext-config, --misses or --stale (or a sweep "
            "file that names them)"
        )


def resolve_backend(name: str, device: DeviceFingerprint) -> Backend:
    """The named backend, checked against the device, or for "auto" the best one available there."""
    if name == "auto":
        return registry.default_backend(device)
    backend = registry.get(name)
    reason = backend.available(device)
    if reason is not None:
        raise ConfigInvalid(f"backend {name!r} cannot run on {device.device_kind}: {reason}")
    return backend


def compile_target(spec: SweepSpec, backend: Backend) -> str:
    """The target of a compile-only sweep: --arch, or the backend's only target."""
    if not backend.compile_targets:
        raise ConfigInvalid(f"backend {backend.name} has no compile-only mode")
    if spec.arch is None:
        if len(backend.compile_targets) > 1:
            raise ConfigInvalid(f"--compile-only needs --arch: one of {', '.join(backend.compile_targets)}")
        return backend.compile_targets[0]
    if spec.arch not in backend.compile_targets:
        raise ConfigInvalid(
            f"--arch {spec.arch} is not one of {', '.join(backend.compile_targets)} ({backend.name})"
        )
    return spec.arch


def stand_in_device(backend: Backend, target: str) -> DeviceFingerprint:
    """The fingerprint compile-only trials are recorded under: never the fingerprint of a timing device.

    A backend may implement `Backend.target_device` (flydsl does) so that its search space sees the
    facts it reads; otherwise the target's name stands in for the device.
    """
    try:
        return backend.target_device(target)
    except Unsupported:
        return compile_only_device(f"{target} (compile-only)", "compile-only", target)


def resolve_target(
    spec: SweepSpec, device: DeviceFingerprint
) -> tuple[Backend, DeviceFingerprint, str | None]:
    """(backend, the device trials are recorded under, the compile-only target or None).

    A normal sweep tunes for the workers' `device`; a compile-only sweep for the spec's target, which
    no machine of the cluster needs to have.
    """
    if not spec.compile_only:
        return resolve_backend(spec.backend, device), device, None
    if spec.backend == "auto":
        raise ConfigInvalid("--compile-only needs --backend: a backend that compiles without its device")
    backend = registry.get(spec.backend)
    target = compile_target(spec, backend)
    return backend, stand_in_device(backend, target), target


def make_executor(
    spec: SweepSpec,
    *,
    inline: bool = False,
    on_starting: Callable[[list[WorkerActivity]], None] | None = None,
) -> tuple[Executor, bool]:
    """A Ray executor (joining spec.ray_address, or a local cluster), or an in-process one; and whether
    this call started a local Ray cluster that the caller should shut down. `on_starting` is told what
    the Ray workers do while they start (RayExecutor)."""
    if inline:
        return InlineExecutor(), False
    from moetune.tuner import ray_pool

    # The devices a named backend times on (Ray's GPUs unless it names a custom resource, e.g. amd_gpu).
    backend = registry.get(spec.backend) if spec.backend != "auto" else None
    check_local_workers(spec)
    started = ray_pool.connect(spec.ray_address)
    try:
        if spec.ray_address is not None:
            check_workers(spec, ray_pool.cluster_cpus(), f"the Ray cluster at {spec.ray_address}")
        executor = ray_pool.RayExecutor(
            workers=spec.workers,
            timeout_s=spec.timeout_s,
            use_devices=not spec.compile_only,
            device_resource=backend.device_resource if backend else "GPU",
            visible_devices_env=backend.visible_devices_env if backend else "CUDA_VISIBLE_DEVICES",
            on_starting=on_starting,
        )
        return executor, started
    except BaseException:
        if started:
            ray_pool.disconnect()
        raise


def check_space(spec: SweepSpec, backend: Any, planned: list[PlannedProblem], device: Any) -> None:
    """Fail before anything is written when the sweep's `space:` does not fit the backend's space."""
    if not spec.space:
        return
    # The domains' names and values are the same for every problem of one backend: the first problem the
    # backend serves tells (the driver skips the others, with the reason).
    for p in planned:
        try:
            space = backend.search_space(p.problem, device)
        except Unsupported:
            continue
        space.restricted(spec.space)
        return


def create_sweep(
    store: Any,
    spec: SweepSpec,
    backend: Backend,
    planned: list[PlannedProblem],
    device: DeviceFingerprint,
    sweep_file: str | None,
    *,
    owner: Any = None,
    force: bool = False,
) -> int:
    """The sweep row; it keeps the resolved spec and problem list so that --resume rebuilds this sweep.
    With `owner` (moetune.db.leases.Owner) the sweep is leased to it, and a timing sweep claims `device`
    (DeviceBusy, nothing written, while another live sweep times on it, unless `force`)."""
    stored = {
        # The database URL stays out: it may hold a password, and the sweep is in that database anyway.
        "spec": spec.to_dict() | {"backend": backend.name, "db": None},
        "problems": [p.to_dict() for p in planned],
        "device": device.to_dict(),
    }
    return store.create_sweep(
        backend=backend.name,
        strategy=spec.strategy,
        spec=stored,
        host=socket.gethostname(),
        user=_user(),
        sweep_file=sweep_file,
        owner=owner,
        device=None if spec.compile_only else device,
        force=force,
    )


def load_sweep(store: Any, sweep_id: int) -> tuple[SweepSpec, list[PlannedProblem]]:
    """The spec and problems of a stored sweep, for --resume."""
    row = store.get_sweep(sweep_id)
    try:
        spec = SweepSpec.from_dict(row.spec["spec"], f"sweep {sweep_id}")
        planned = [PlannedProblem.from_dict(p) for p in row.spec["problems"]]
    except (KeyError, TypeError) as e:
        raise ConfigInvalid(
            f"sweep {sweep_id} was not started by `moetune tune` (no stored plan: {e})"
        ) from e
    return spec, planned


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return os.environ.get("USER", "")
