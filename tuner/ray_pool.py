"""The Ray executor: compile in parallel on every core, time exclusively on every device.

Design (a JAX executable cannot move between processes, so compile and time share a worker):

    driver ──prepare(task)──► worker 0..N-1 (one CPU each)    lower + compile, all in parallel
           ◄── ready ───────
           ──run(task_id)───► the same worker                 verify + time, on its device
                              only when that device's lane is free: one run per lane at a time

A lane is one GPU (workers hold a fraction of it, so Ray pins each worker to one GPU and sets
CUDA_VISIBLE_DEVICES), or the CPU of a host without GPUs. The driver owns the lanes, so no lock can
leak when a worker dies, and a timeout measures only the worker's own phase, never time spent queueing
for the device. Waiting for a lane does not count against `timeout_s`; each phase gets `timeout_s`
(a backend that compiles on the device, `Backend.compiles_on_device`, compiles in the second phase).
Lanes belong to one sweep's driver: two sweeps timing on the same GPU at once would overlap, so run one
sweep per device at a time.

Several GPUs (one host or many): one cluster, one lane per GPU. With N workers and G GPUs each worker
holds 1/ceil(N/G) of a GPU, and its lane is named after the GPU id Ray assigned it (`ray.get_gpu_ids`),
so the G lanes time in parallel (tests/tuner/test_multi_gpu_scheduling.py, with fake GPUs on a CPU).

Devices Ray does not know (a backend's `device_resource` other than "GPU", e.g. `amd_gpu` declared by
`ray start --resources '{"amd_gpu": 8}'`): Ray tracks a custom resource as a count per node, never as
device ids, so the driver seats workers itself. Each unit k of each node is a lane ("host:amd_gpu1");
a worker is placed on its seat's node (node affinity), holds 1/ceil(N/G) of the resource, and its
process sees only device k (the backend's `visible_devices_env`, e.g. HIP_VISIBLE_DEVICES=k), so JAX
and the backend's timer use that device alone. A cluster that declares no such resource falls back
to Ray's "GPU" (where Ray detects the devices itself). A replacement worker takes the seat of the one it
replaces (tests/tuner/test_custom_device_resource.py, with a fake `amd_gpu` on a CPU).

Compile-only sweeps (backends that compile without their device, for a target this cluster may not
have) use workers that hold no GPU: they run on CPU-only nodes as well, and never enter a lane.

Affinity: each worker keeps the inputs, float32 references and timing rotations of the problems it
served (tuner/input_cache.py), and rebuilding them is device work that holds up the worker's lane. So an
idle worker that served the task's problem takes it first, then one that holds the same weights (another
token count of the same projection), then any.

Faults: a worker that dies (segfault, os._exit, OOM kill) yields a `crashed` result, one that passes
its deadline is killed and yields `timeout`; either way a fresh worker takes its place and the sweep
goes on. Ray never restarts or retries on its own (max_restarts=0), so every fault is seen here once.
"""

from __future__ import annotations

import collections
import dataclasses
import ipaddress
import itertools
import logging
import math
import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import MoetuneError
from moetune.kernels.registry import ENV_EXTRA
from moetune.tuner import executors, local_cluster
from moetune.tuner.executors import Executor, WorkerActivity
from moetune.tuner.tasks import (
    CRASHED,
    TIMEOUT,
    CandidateResult,
    Result,
    RetimeTask,
    Task,
    device_work,
    error_text,
    failed,
    weights_key,
)

# Enough for the small task and result objects this executor moves; Ray's default takes 30% of memory.
OBJECT_STORE_BYTES = 256 * 2**20
# A worker starts a Python process and imports JAX: slow on a busy node, but not minutes.
STARTUP_TIMEOUT_S = 300.0
# Workers that die while starting, in a row, before the sweep gives up (a broken environment).
MAX_START_FAILURES = 3
# How many recent tasks per worker the scheduler remembers for affinity (about what its cache holds).
AFFINITY_MEMORY = 4
# A free lane goes to the ready worker with the least device work (tasks.device_work), unless one has
# waited longer than this: then the longest-waiting goes first, so large problems are never starved.
LANE_PATIENCE_S = 10.0

# The local cluster connect() started, for disconnect() to stop: Ray's own connection is per process too.
_local: local_cluster.LocalCluster | None = None


class PoolError(MoetuneError):
    """The Ray cluster cannot run the sweep (no workers start, mixed devices, bad address)."""


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    name: str
    host: str
    pid: int
    node_id: str
    lane: str  # "host:gpu0", "host:amd_gpu0" (a custom device resource) or "host:cpu"
    fingerprint: DeviceFingerprint


class _Worker:
    """A Ray actor (wrapped by ray.remote in RayExecutor): one CandidateRunner and its prepared tasks."""

    def __init__(self, name: str) -> None:
        from moetune.tuner.candidate import CandidateRunner

        self._runner = CandidateRunner(name)
        self._prepared: dict[str, Any] = {}

    def describe(self, seat: str | None = None) -> WorkerInfo:
        """`seat`: the device unit the driver placed this worker on ("amd_gpu1"), for custom resources."""
        import ray

        from moetune.kernels.device import current_fingerprint

        fingerprint = current_fingerprint()  # imports JAX and opens the device: the startup cost, paid once
        gpu_ids = ray.get_gpu_ids()
        node = ray.get_runtime_context().get_node_id()
        device = seat or (f"gpu{gpu_ids[0]}" if gpu_ids else "cpu")
        lane = f"{self._runner.host}:{device}"
        return WorkerInfo(self._runner.worker, self._runner.host, os.getpid(), node, lane, fingerprint)

    def prepare(self, task: Task) -> Result | None:
        from moetune.tuner.candidate import Prepared

        outcome = self._runner.prepare(task)
        if isinstance(outcome, Prepared):
            self._prepared[task.task_id] = outcome
            return None
        return outcome

    def run(self, task_id: str) -> Result:
        return self._runner.run(self._prepared.pop(task_id))


@dataclasses.dataclass(frozen=True)
class _Seat:
    """One unit of a custom device resource: a node and the index of the device on it."""

    node_id: str
    index: int
    resource: str

    @property
    def name(self) -> str:
        return f"{self.resource}{self.index}"


@dataclasses.dataclass
class _Slot:
    name: str
    actor: Any
    seat: _Seat | None = None
    phase: str = "starting"  # starting | idle | prepare | ready | run
    ref: Any = None
    deadline: float = math.inf
    task: Task | None = None
    info: WorkerInfo | None = None
    ready_since: float = 0.0
    served: deque[Task] = dataclasses.field(default_factory=lambda: deque(maxlen=AFFINITY_MEMORY))
    first_of_problem: bool = False  # its task is its first of that problem it remembers: it makes the inputs


def _lane(slot: _Slot) -> str:
    """The lane of a started worker ("" before it reports one)."""
    return slot.info.lane if slot.info is not None else ""


def affinity(slot: _Slot, task: Task) -> int:
    """How much of `task`'s inputs `slot`'s worker likely holds: 2 its problem's, 1 its weights, 0 none."""
    seed = getattr(task, "seed", 0)  # compile-only tasks have no inputs
    score = 0
    for served in slot.served:
        served_seed = getattr(served, "seed", 0)
        if (served.problem, served_seed) == (task.problem, seed):
            return 2
        if weights_key(served.problem, served_seed) == weights_key(task.problem, seed):
            score = 1
    return score


def connect(address: str | None = None, *, num_cpus: int | None = None) -> bool:
    """Join the cluster at `address`, or start a local one (tuner/local_cluster.py: on loopback only, with
    a private token, without the database's secrets, gone with this process); True if this started it."""
    global _local
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return False
    quiet = dict(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    if address:
        _join(address, quiet)
        route_ray_messages()
        return False
    cluster = local_cluster.start(num_cpus or len(os.sched_getaffinity(0)), OBJECT_STORE_BYTES)
    import ray

    try:
        ray.init(address=cluster.address, **quiet)
    except BaseException:
        cluster.stop()
        raise
    route_ray_messages()
    _local = cluster
    return True


def route_ray_messages() -> None:
    """Send the raylet's messages that Ray's driver prints ("A worker died or was killed ...") to stderr.

    Ray 2.60 prints them to stdout (worker.listen_error_messages calls print_to_stdstream with is_err
    False, from a thread that runs while the driver is connected), where they would land before a
    command's result (`tune --json`). Its module-level function is wrapped, since the thread looks it up
    at each message; drop this once Ray prints them to stderr."""
    import ray._private.worker as ray_worker

    printer = getattr(ray_worker, "print_to_stdstream", None)
    if printer is None or getattr(printer, "_moetune_stderr", False):
        return

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:
        printer({**data, "is_err": True}, ignore_prefix=ignore_prefix)

    to_stderr._moetune_stderr = True  # type: ignore[attr-defined]
    ray_worker.print_to_stdstream = to_stderr


# Seconds a join of --ray-address may take before it is given up: Ray itself waits much longer (over ten
# minutes for an address that drops packets) and says nothing meanwhile.
JOIN_TIMEOUT_S = 60.0


def _join(address: str, options: dict[str, Any]) -> None:
    """ray.init(address), bounded by JOIN_TIMEOUT_S, failing with one line that names the address.

    The GCS port is tried first (refused or unreachable: at once, or after the bound). For a loopback
    address Ray is told to keep the node on loopback (local_cluster.LOOPBACK_ENV, read when Ray is
    imported): otherwise it replaces 127.0.0.1 by the machine's network address, looks for the cluster's
    raylet there, and waits for ever for a cluster that listens on loopback only."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    began = time.monotonic()
    if "://" not in address and port.isdigit():  # HOST:PORT; "auto" and URLs go to Ray as they are
        try:
            socket.create_connection((host, int(port)), timeout=JOIN_TIMEOUT_S).close()
        except OSError as e:
            raise PoolError(f"cannot join the Ray cluster at {address}: {e.strerror or e}") from e
    if _is_loopback(host) and "ray" not in sys.modules:  # read when Ray is imported
        os.environ.setdefault(local_cluster.LOOPBACK_ENV, "0")
    import ray

    done: list[BaseException | None] = []

    def init() -> None:
        try:
            ray.init(address=address, **options)
            done.append(None)
        except BaseException as e:  # handed to the caller's thread
            done.append(e)

    # In a thread of its own: Ray may wait inside its C++ client (for a GCS that never answers), where no
    # signal reaches it. That thread never sets Ray's SIGTERM handler, and Ray's warning saying so is left
    # out (the driver's default is to end at SIGTERM, which is what that handler does too).
    worker_log = logging.getLogger("ray._private.worker")
    level = worker_log.level
    worker_log.setLevel(logging.ERROR)
    try:
        thread = threading.Thread(target=init, name="moetune-ray-join", daemon=True)
        thread.start()
        thread.join(max(1.0, JOIN_TIMEOUT_S - (time.monotonic() - began)))
    finally:
        worker_log.setLevel(level)
    if not done:
        raise PoolError(
            f"cannot join the Ray cluster at {address}: no answer within {JOIN_TIMEOUT_S:.0f} s (is it a Ray "
            "cluster's GCS address, and does it listen on an address this machine reaches?)"
        )
    error = done[0]
    if isinstance(error, Exception):  # Ray's own (authentication, version mismatch) and the OS's alike
        raise PoolError(f"cannot join the Ray cluster at {address}: {_one_line(error)}") from error
    if error is not None:
        raise error


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def disconnect() -> None:
    global _local
    import ray

    ray.shutdown()
    if _local is not None:
        _local.stop()
        _local = None


def default_worker_count(use_devices: bool = True, device_resource: str = "GPU") -> int:
    """One compile worker per CPU (each holds one CPU while it compiles): of the nodes with devices when
    the workers need a device there, of every node otherwise."""
    import ray

    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    if use_devices and any(resources.get(device_resource) for resources in nodes):
        nodes = [resources for resources in nodes if resources.get(device_resource)]
    return max(1, int(sum(resources.get("CPU", 0) for resources in nodes)))


def cluster_cpus() -> int:
    """The CPUs of the joined cluster's live nodes: each worker holds one."""
    import ray

    return int(sum(node["Resources"].get("CPU", 0) for node in ray.nodes() if node.get("Alive")))


def _device_units(resource: str) -> list[_Seat]:
    """Every unit of a custom device resource in the cluster, node by node."""
    import ray

    return [
        _Seat(node["NodeID"], index, resource)
        for node in ray.nodes()
        if node.get("Alive")
        for index in range(int(node["Resources"].get(resource, 0)))
    ]


def worker_env() -> dict[str, str]:
    """What workers inherit from the driver: extra backends (tests, plug-ins), where to import them, JAX's
    settings (every JAX_* variable) and its memory settings.

    N workers share a GPU, so none may preallocate most of it. Each worker's allocator keeps what it once
    used, so sweeps of the largest shapes on one GPU want fewer workers (--workers), or
    XLA_PYTHON_CLIENT_MEM_FRACTION / XLA_PYTHON_CLIENT_ALLOCATOR set in the driver's environment.
    JAX_COMPILATION_CACHE_DIR (with JAX_COMPILATION_CACHE_MAX_SIZE, which turns on the cache's file locks)
    lets workers reuse each other's compiled set-up programs (README, "Tuning").
    """
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    for name, value in os.environ.items():
        if name in (ENV_EXTRA, "PYTHONPATH") or name.startswith(("JAX_", "XLA_PYTHON_CLIENT_")):
            env[name] = value
    return env


class RayExecutor(Executor):
    def __init__(
        self,
        *,
        workers: int | None = None,
        timeout_s: float = 120.0,
        use_devices: bool = True,
        device_resource: str = "GPU",
        visible_devices_env: str = "CUDA_VISIBLE_DEVICES",
        on_starting: Callable[[list[WorkerActivity]], None] | None = None,
    ) -> None:
        """`use_devices=False` (compile-only sweeps): workers hold no device, so they run on any node,
        CPU-only ones included, and may see different devices. `device_resource` and
        `visible_devices_env` come from the backend (`Backend.device_resource`). `on_starting` is told
        the workers' activity about once a second while they start (a progress display's set-up rows)."""
        import ray

        self._ray = ray
        self.timeout_s = timeout_s
        self.use_devices = use_devices
        self._visible_devices_env = visible_devices_env
        units = _device_units(device_resource) if use_devices and device_resource != "GPU" else []
        self._count = workers or default_worker_count(use_devices, device_resource if units else "GPU")
        self._options: dict[str, Any] = dict(num_cpus=1, max_restarts=0, max_task_retries=0)
        devices = len(units) or (ray.cluster_resources().get("GPU", 0) if use_devices else 0)
        # k workers per device hold 1/k of it each: Ray pins every worker to one GPU; for a custom
        # resource the seats below do, and the fraction only keeps Ray from over-placing.
        per_device = math.ceil(self._count / devices) if devices else 0
        if per_device:
            share = 1.0 / per_device
            self._options |= {"resources": {device_resource: share}} if units else {"num_gpus": share}
        seats: list[_Seat | None] = [seat for _ in range(per_device) for seat in units] or [None]
        self._actor = ray.remote(_Worker)
        self._env = worker_env()
        self._names = itertools.count()
        self._slots = [self._spawn(seats[i % len(seats)]) for i in range(self._count)]
        self._queue: deque[Task] = deque()
        self._lanes: dict[str, _Slot | None] = {}
        self._start_failures = 0
        self.device = self._start(on_starting)

    # --- workers ----------------------------------------------------------------------------------

    def _spawn(self, seat: _Seat | None) -> _Slot:
        name = f"w{next(self._names)}"
        options, env = dict(self._options), self._env
        if seat is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(seat.node_id, soft=False)
            env = env | {self._visible_devices_env: str(seat.index)}
        actor = self._actor.options(**options, runtime_env={"env_vars": env}).remote(name)
        slot = _Slot(name, actor, seat)
        slot.ref = actor.describe.remote(seat.name if seat else None)
        slot.deadline = time.monotonic() + STARTUP_TIMEOUT_S
        return slot

    def _replace(self, slot: _Slot) -> None:
        self._ray.kill(slot.actor, no_restart=True)
        if slot.info is not None and self._lanes.get(slot.info.lane) is slot:
            self._lanes[slot.info.lane] = None
        self._slots[self._slots.index(slot)] = self._spawn(slot.seat)

    def _start(self, on_starting: Callable[[list[WorkerActivity]], None] | None) -> DeviceFingerprint:
        """Wait for every worker to come up; they must all see the same kind of device."""
        while any(slot.phase == "starting" for slot in self._slots):
            if on_starting is not None:
                on_starting(self.activity())
            self._poll(time.monotonic() + (1.0 if on_starting else STARTUP_TIMEOUT_S))
        kinds = {slot.info.fingerprint.hash: slot.info.fingerprint for slot in self._slots if slot.info}
        if len(kinds) != 1 and self.use_devices:
            described = "; ".join(f"{fp.device_kind} ({h})" for h, fp in kinds.items())
            raise PoolError(
                f"the workers see different devices ({described}); tune one device model per sweep"
            )
        return next(iter(kinds.values()))

    @property
    def workers(self) -> int:
        return self._count

    def worker_infos(self) -> list[WorkerInfo]:
        return [slot.info for slot in self._slots if slot.info is not None]

    # --- the Executor contract --------------------------------------------------------------------

    def capacity(self) -> int:
        free = sum(1 for slot in self._slots if slot.phase in ("idle", "starting"))
        return max(0, free - len(self._queue))

    def submit(self, task: Task) -> None:
        self._queue.append(task)

    def in_flight(self) -> int:
        return len(self._queue) + sum(1 for slot in self._slots if slot.task is not None)

    def lanes(self) -> dict[str, str]:
        return {
            lane: (slot.task.label if slot and slot.task else "idle")
            for lane, slot in sorted(self._lanes.items())
        }

    def activity(self) -> list[WorkerActivity]:
        return [_activity(slot) for slot in self._slots]

    def wait(self, timeout_s: float) -> list[Result]:
        until = time.monotonic() + timeout_s
        results: list[Result] = []
        while True:
            self._dispatch()
            results += self._poll(time.monotonic() if results else until)
            if results or time.monotonic() >= until or not self.in_flight():
                return results

    def close(self) -> None:
        for slot in self._slots:
            self._ray.kill(slot.actor, no_restart=True)
        self._slots = []

    # --- scheduling -------------------------------------------------------------------------------

    def _deadline(self, task: Task) -> float:
        configs = len(task.configs) if isinstance(task, RetimeTask) else 1
        return time.monotonic() + self.timeout_s * configs

    def _dispatch(self) -> None:
        idle = [slot for slot in self._slots if slot.phase == "idle"]
        load = self._lane_load()
        while idle and self._queue:
            task = self._queue.popleft()
            # Among workers equally likely to hold the inputs, one on the device with the least work
            # queued: on two H200s, first-idle order sent the sweep's first 14 tasks (its largest
            # problems) to GPU 0's 14 workers, whose lane then stayed saturated while GPU 1's idled
            # half the time. Ties after that: the first idle worker.
            slot = max(idle, key=lambda s: (affinity(s, task), -load[_lane(s)]))
            load[_lane(slot)] += device_work(task)
            idle.remove(slot)
            slot.first_of_problem = affinity(slot, task) < 2
            slot.task = task
            slot.served.append(task)
            slot.phase, slot.ref, slot.deadline = (
                "prepare",
                slot.actor.prepare.remote(task),
                self._deadline(task),
            )
        self._grant_lanes()

    def _lane_load(self) -> collections.Counter:
        """Device work (tasks.device_work) of the tasks each lane's workers hold, in any phase."""
        load: collections.Counter = collections.Counter()
        for slot in self._slots:
            if slot.task is not None:
                load[_lane(slot)] += device_work(slot.task)
        return load

    def _grant_lanes(self) -> None:
        """Start a ready worker's run on every free lane: shortest device work first, except that a worker
        waiting longer than LANE_PATIENCE_S goes before all others (longest-waiting first among those).
        Shortest first keeps the CPUs busy: a small problem's trial holds the H200 for ~0.08 s, a T=16384
        one for up to 1.6 s, and in first-come order a small trial queued behind several large ones
        waited seconds for a tenth of a second of GPU time (on the H200, a one-GPU Mixtral sweep spent
        a third of its workers' time waiting for the lane). `_poll` calls this too, as soon as a run
        ends, so a lane never idles while the driver records results."""
        now = time.monotonic()

        def order(slot: _Slot) -> tuple[bool, int, float]:
            overdue = now - slot.ready_since > LANE_PATIENCE_S
            return (not overdue, 0 if overdue else device_work(slot.task), slot.ready_since)

        waiting = sorted((s for s in self._slots if s.phase == "ready"), key=order)
        for slot in waiting:
            lane = slot.info.lane
            if self._lanes.get(lane) is None:
                self._lanes[lane] = slot
                slot.phase, slot.ref = "run", slot.actor.run.remote(slot.task.task_id)
                slot.deadline = self._deadline(slot.task)

    def _poll(self, until: float) -> list[Result]:
        """Collect finished calls (waiting at most until `until`, or the next deadline); handle deadlines."""
        busy = {slot.ref: slot for slot in self._slots if slot.ref is not None}
        if not busy:
            return []
        next_deadline = min(slot.deadline for slot in busy.values())
        wait_s = max(0.0, min(until, next_deadline) - time.monotonic())
        done, _ = self._ray.wait(list(busy), num_returns=1, timeout=wait_s)
        if done:
            done, _ = self._ray.wait(list(busy), num_returns=len(busy), timeout=0)
        results = []
        for ref in done:
            results += self._finish(busy[ref], ref)
        if done:
            self._grant_lanes()
        now = time.monotonic()
        for slot in list(self._slots):
            if slot.ref is not None and slot.ref not in done and now > slot.deadline:
                results += self._expire(slot)
        return results

    def _finish(self, slot: _Slot, ref: Any) -> list[Result]:
        phase, task = slot.phase, slot.task
        slot.ref = None
        try:
            value = self._ray.get(ref)
        except self._ray.exceptions.RayError as e:
            # The worker died (RayActorError) or a call raised outside the candidate's own error
            # handling (RayTaskError): either way the worker's state is suspect, so replace it.
            message = f"worker {slot.name} failed while {_doing(phase)}: {_describe(e)}"
            return self._lost(slot, phase, task, CRASHED, message)
        if phase == "starting":
            slot.info, slot.phase, slot.deadline = value, "idle", math.inf
            self._lanes.setdefault(value.lane, None)
            self._start_failures = 0
            return []
        if phase == "prepare" and value is None:
            slot.phase, slot.ready_since, slot.deadline = "ready", time.monotonic(), math.inf
            return []
        if phase == "run":
            self._lanes[slot.info.lane] = None
            if isinstance(value, CandidateResult):
                value = dataclasses.replace(value, lane=slot.info.lane)
        slot.phase, slot.task, slot.deadline = "idle", None, math.inf
        return [value]

    def _expire(self, slot: _Slot) -> list[Result]:
        message = (
            f"worker {slot.name} gave no result within {self.timeout_s:g}s while {_doing(slot.phase)}; killed"
        )
        return self._lost(slot, slot.phase, slot.task, TIMEOUT, message)

    def _lost(self, slot: _Slot, phase: str, task: Task | None, status: str, message: str) -> list[Result]:
        if phase == "starting":
            self._start_failures += 1
            if self._start_failures >= MAX_START_FAILURES:
                raise PoolError(f"workers fail to start ({message})")
            self._replace(slot)
            return []
        host = slot.info.host if slot.info else ""
        self._replace(slot)
        return [failed(task, status, message, worker=slot.name, host=host)]


_STATES = {
    "starting": executors.STARTING,
    "idle": executors.IDLE,
    "ready": executors.WAITING,
    "run": executors.TIMING,
}


def _activity(slot: _Slot) -> WorkerActivity:
    if slot.phase == "prepare":
        state = executors.PREPARING if slot.first_of_problem else executors.COMPILING
    else:
        state = _STATES[slot.phase]
    task = slot.task
    return WorkerActivity(
        slot.name,
        _lane(slot),
        state,
        task.task_id if task else "",
        task.label if task else "",
        first_of_problem=bool(task) and slot.first_of_problem,
    )


def _doing(phase: str) -> str:
    return {"starting": "starting", "prepare": "compiling", "run": "verifying and timing"}.get(phase, phase)


def _describe(error: BaseException) -> str:
    """A short account of a Ray failure for the trial row (display only; statuses come from types)."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, BaseException) and not isinstance(cause, type(error)):
        return error_text(cause)
    text = " ".join(str(error).split())
    detail = text.partition("Worker exit detail:")[2].partition(". Some common causes")[0].strip()
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"{first} ({detail})" if detail else first
