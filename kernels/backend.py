"""The contract every backend implements; a backend is one folder `kernels/<name>/` exposing `BACKEND`.

A backend declares the ops it serves in `kernels`, an op -> kernel table: op name -> the name of the
function computing it in `kernel_module` (imported on first use by `kernel_for`). Serving a new op is one
kernel function and one entry there (docs/adding-an-op.md).

Call order, as dispatch and the tuner use it:
  1. `available(device)`      -> None when the backend can run on this device, else a one-line reason.
  2. `check(problem)`         -> raises Unsupported when the backend declines the problem: an op not in
                                 its table, or whatever its `check_problem` hook declines.
  3. `search_space(problem, device)` (tuner) or `heuristic(problem, device)` (dispatch miss).
  4. `build(problem, config)` -> a JAX-callable f(lhs, rhs, group_sizes) -> out; pure, jit-able. Its
                                 arguments are the op's operands (OpSpec.operands) in order, and lhs
                                 may have MORE rows than problem.m: rows past m belong to no group and
                                 their contents are ignored; the result is [m, out_n] all the same (a
                                 producer can hand over an lhs already padded to a kernel's tile).
  5. `timer()` (tuner)        -> how this backend's kernels are timed; it times what `executable`
                                 returns for the compiled kernel (by default the JAX executable itself).
  Optional, for backends that compile without the device (`compile_targets` non-empty):
  `compile_only(problem, config, target)` -> StaticCompile: compile for a named target (e.g. "gfx942")
  on a CPU-only machine and say whether the binary is worth timing (`moetune tune --compile-only`).
  `target_device(target)` -> the stand-in fingerprint its search space and trials use for that target.

Backends hold no mutable state; every method may be called from any thread.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import hashlib
import importlib
import importlib.resources
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from moetune.kernels.config import KernelConfig
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import Unsupported
from moetune.kernels.problem import Problem
from moetune.kernels.timing import Timer, WallTimer

if TYPE_CHECKING:
    from moetune.kernels.space import SearchSpace

KernelFn = Callable[[Any, Any, Any], Any]


@dataclasses.dataclass(frozen=True)
class StaticCompile:
    """One candidate compiled without its device: what a compile-only trial records.

    `pruned` is the reason the binary is not worth timing (it spills, overflows LDS, ...), or None.
    Candidates with equal `binary_hash` are one kernel: time the first, reuse its timing for the rest.
    """

    binary_hash: str
    metrics: dict[str, Any]
    compile_s: float
    pruned: str | None = None


class Backend(abc.ABC):
    name: ClassVar[str]
    config_cls: ClassVar[type[KernelConfig]]
    # The Config of an op whose kernel `config_cls` does not describe (mosaic_gpu's fused MoE decode
    # block, two Pallas Triton kernels beside its Mosaic GEMMs): op name -> its Config. Every other op of
    # the table takes `config_cls`; `config_class(op)` says which.
    op_configs: ClassVar[Mapping[str, type[KernelConfig]]] = {}
    # Among available backends, the default is the one with the highest priority.
    priority: ClassVar[int] = 0
    # Backends that compile without the target device may be compiled on CPU-only nodes.
    compiles_without_device: ClassVar[bool] = False
    # Targets compile_only accepts (e.g. ("gfx942", "gfx950")); empty: no compile-only mode.
    compile_targets: ClassVar[tuple[str, ...]] = ()
    # The Ray resource a tuner worker holds to use one of this backend's devices: "GPU" is Ray's own
    # (Ray pins each worker to a GPU id); any other name is a custom resource declared one unit per
    # device (`ray start --resources '{"amd_gpu": 8}'`), and the tuner seats each worker on one unit,
    # restricting its process to that device through `visible_devices_env`.
    # Whether built kernels take `row_start=` (a traced int32 scalar: the first row of the first group),
    # which serves jax.lax.ragged_dot's group_offset, a local slice of experts (kernels/api.py): for every
    # op (True) or the ops named. A backend without it declines such calls, which then fall through to
    # one that has it.
    serves_group_offset: ClassVar[bool | frozenset[str]] = False
    device_resource: ClassVar[str] = "GPU"
    visible_devices_env: ClassVar[str] = "CUDA_VISIBLE_DEVICES"
    # The ops this backend serves: op name -> the name of its kernel function in `kernel_module`, or
    # "module:function" for one in another module of the backend's package. A backend with an empty
    # table serves nothing.
    kernels: ClassVar[Mapping[str, str]] = {}
    kernel_module: ClassVar[str] = ""
    # Modules outside the backend's folder whose source is part of what its configs compute (a kernel it
    # imports from kernels/moe/): hashed with the folder, so that editing one makes its winners stale.
    shared_kernel_modules: ClassVar[tuple[str, ...]] = ()
    # A rough prior of one candidate's compile seconds on a tuning worker: the tuner's estimates
    # (tuner/cost_model.py) use it until the database holds trials of this backend on the device model.
    prior_compile_s: ClassVar[float] = 2.0

    @abc.abstractmethod
    def available(self, device: DeviceFingerprint) -> str | None:
        """None if this backend runs on `device`, otherwise why not."""

    def check(self, problem: Problem) -> None:
        """Raise Unsupported if the backend cannot compute `problem` at all: its op is not in `kernels`,
        or `check_problem` declines it."""
        self._require_served(problem.op)
        self.check_problem(problem)

    def check_problem(self, problem: Problem) -> None:  # noqa: B027 - optional hook, accepting by default
        """Raise Unsupported for a problem of a served op that this backend still cannot compute (dtypes,
        alignment)."""

    def config_class(self, op: str) -> type[KernelConfig]:
        """The Config class of `op`'s kernels: `op_configs`'s, else `config_cls`."""
        return self.op_configs.get(op, self.config_cls)

    def config_classes(self) -> tuple[type[KernelConfig], ...]:
        """Every Config class of this backend: a config of one of them names the backend."""
        return (self.config_cls, *self.op_configs.values())

    def kernel_for(self, op: str) -> Callable[..., Any]:
        """The kernel function of `op` from the table; Unsupported for an op the backend does not serve."""
        self._require_served(op)
        module, _, name = self.kernels[op].rpartition(":")
        if module:
            module = f"{self.kernel_module.rpartition('.')[0]}.{module}"
        return getattr(importlib.import_module(module or self.kernel_module), name)

    def takes_group_offset(self, op: str) -> bool:
        """Whether `op`'s kernels take `row_start=` (serves_group_offset)."""
        served = self.serves_group_offset
        return served if isinstance(served, bool) else op in served

    def _require_served(self, op: str) -> None:
        if op not in self.kernels:
            served = ", ".join(sorted(self.kernels)) or "no op"
            raise Unsupported(f"{self.name} serves op={served}, not op={op!r}")

    @abc.abstractmethod
    def search_space(self, problem: Problem, device: DeviceFingerprint) -> SearchSpace:
        """Domains and constraints of this backend's tunables for `problem` on `device`."""

    @abc.abstractmethod
    def heuristic(self, problem: Problem, device: DeviceFingerprint) -> KernelConfig:
        """A good config without tuning: what dispatch uses when nothing tuned is found."""

    @abc.abstractmethod
    def build(self, problem: Problem, config: KernelConfig) -> KernelFn:
        """A JAX-callable computing `problem` with `config`; raises ConfigInvalid/Unsupported early."""

    def compiles_on_device(self) -> bool:
        """Whether compiling runs work on this process's device. The tuner then compiles while holding the
        device's lane, as it does to time: that work would otherwise run beside another kernel's timing."""
        return False

    def timer(self) -> Timer:
        return WallTimer()

    def executable(
        self, problem: Problem, config: KernelConfig, compiled: Callable[..., Any]
    ) -> Callable[..., Any]:
        """What the tuner verifies and times once `build(problem, config)` is compiled: `compiled` itself,
        unless the backend's timer needs more than a JAX executable (flydsl's times the code object)."""
        return compiled

    def compile_only(self, problem: Problem, config: KernelConfig, target: str) -> StaticCompile:
        """Compile for `target` without its device; raises ConfigInvalid, or the backend's compile error."""
        raise Unsupported(f"backend {self.name} has no compile-only mode")

    def target_device(self, target: str) -> DeviceFingerprint:
        """A stand-in fingerprint for compile-only sweeps of `target`, never a timing device's."""
        raise Unsupported(f"backend {self.name} has no stand-in device for compile-only targets")

    def heuristic_basis(self, device: DeviceFingerprint) -> str | None:
        """What the backend's heuristic plans with on `device`, in one line, where its folder holds a
        calibration module (calibration.py with describe(device_kind)): which part's measurements fitted
        its cost model, and whether they are another part's. None for a backend without one."""
        package = type(self).__module__.rpartition(".")[0]
        if not package:
            return None
        try:
            module = importlib.import_module(f"{package}.calibration")
        except ModuleNotFoundError as e:
            if e.name != f"{package}.calibration":
                raise
            return None
        return module.describe(device.device_kind)

    def source_hash(self) -> str:
        """Hash of the backend's own source folder and its `shared_kernel_modules`: a change to either
        makes every stored winner stale.

        The folder's timer.py is left out: a timer measures kernels and cannot change what they compute
        or how fast they run, so editing it keeps every tuned winner as valid as it was. So are the
        search space and the cost model (space*.py, cost_model*.py, calibration data): they choose which
        configs are tried and the untuned default, never what a given config's kernel does. A backend
        without shared kernel modules hashes its folder alone.
        """
        package = type(self).__module__.rsplit(".", 1)[0] if "." in type(self).__module__ else ""
        return _source_hash(package, self.shared_kernel_modules)


UNHASHED_SOURCES = (
    "timer.py",
    "space.py",
    "space_drhs.py",
    "space_decode.py",
    "cost_model.py",
    "cost_model_decode.py",
    "calibration.py",
)


@functools.cache
def _package_hash(package: str) -> str:
    digest = hashlib.sha256()
    root = importlib.resources.files(package)
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".py") and entry.name not in UNHASHED_SOURCES:
            digest.update(entry.name.encode())
            digest.update(entry.read_bytes())
    return digest.hexdigest()[:16]


@functools.cache
def _source_hash(package: str, modules: tuple[str, ...]) -> str:
    if not modules:  # the folder's hash as it always was: no stored winner goes stale for nothing
        return _package_hash(package)
    digest = hashlib.sha256(_package_hash(package).encode())
    for name in sorted(modules):
        digest.update(name.encode())
        digest.update(_module_source(name))
    return digest.hexdigest()[:16]


def _module_source(name: str) -> bytes:
    """The source of the single-file module `name` (dotted), read from its package without importing it."""
    package, _, leaf = name.rpartition(".")
    return importlib.resources.files(package).joinpath(f"{leaf}.py").read_bytes()
