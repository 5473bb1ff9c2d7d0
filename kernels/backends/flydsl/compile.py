"""Compiling FlyDSL kernels to HSACO on CPU-only machines, one process per candidate, and compile sweeps.

    result = compile_one(problem, config, "gfx942")          # -> CompileResult (code object in the cache)
    results = compile_sweep(problem, "gfx950", configs, workers=2)

Compiles run in compile_worker.py under the FlyDSL interpreter (toolchain.py), in separate processes:
a sweep keeps `workers` of them busy at once (compiles are CPU-bound, seconds each), each serving many
candidates because starting the interpreter costs more than a compile; a compiler crash costs the one
candidate in flight. Code objects are stored by content hash under the cache directory, so identical
binaries from different configs are one file and one timing. Static pruning reads the code object's metadata
(metadata.py): a candidate that spills or overflows LDS is `pruned` with the reason and never timed.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import os
import queue
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from moetune.kernels.backends.flydsl import metadata, toolchain
from moetune.kernels.backends.flydsl.config import FlyDSLConfig
from moetune.kernels.backends.flydsl.plan import ARCHS, KernelPlan
from moetune.kernels.errors import ConfigInvalid, MoetuneError
from moetune.kernels.problem import Problem

WORKER = Path(__file__).with_name("compile_worker.py")
DEFAULT_TIMEOUT_S = 600.0

# Statuses of a sweep entry, the names the trial table uses.
OK, PRUNED, COMPILE_ERROR = "ok", "pruned", "compile_error"


class CompileFailed(MoetuneError):
    """FlyDSL or the linker rejected the kernel, or the worker process died or timed out."""


@dataclasses.dataclass(frozen=True)
class CompileResult:
    """One compiled candidate: where its code object is and what it statically uses."""

    arch: str
    binary_hash: str
    hsaco_path: str
    kernel_name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    metrics: metadata.KernelMetrics
    compile_s: float  # FlyDSL's trace + lowering + link, as the worker measured it
    wall_s: float  # the whole worker process, interpreter start included
    flydsl_version: str

    @property
    def code_object(self) -> bytes:
        return Path(self.hsaco_path).read_bytes()


@dataclasses.dataclass(frozen=True)
class SweepEntry:
    """The outcome of one config in a compile sweep (what a compile-only trial row stores)."""

    config: FlyDSLConfig
    status: str  # ok | pruned | compile_error
    reason: str = ""  # why pruned, or the compiler's message
    result: CompileResult | None = None
    duplicate_of: int | None = None  # index of the first entry with the same binary: time that one

    @property
    def needs_timing(self) -> bool:
        return self.status == OK and self.duplicate_of is None

    def to_dict(self) -> dict[str, Any]:
        r = self.result
        return {
            "config": self.config.to_dict(),
            "status": self.status,
            "reason": self.reason,
            "duplicate_of": self.duplicate_of,
            "binary_hash": r.binary_hash if r else None,
            "compile_s": r.compile_s if r else None,
            "wall_s": r.wall_s if r else None,
            "metrics": {k: v for k, v in r.metrics.to_dict().items() if k != "args"} if r else None,
        }


def plan_for(problem: Problem, config: FlyDSLConfig, arch: str) -> KernelPlan:
    """The kernel plan, or ConfigInvalid naming every rule the combination breaks."""
    if arch not in ARCHS:
        raise ConfigInvalid(f"arch={arch!r} is not one of {', '.join(ARCHS)}")
    if problem.lhs_dtype != problem.rhs_dtype:
        raise ConfigInvalid(f"lhs_dtype={problem.lhs_dtype} and rhs_dtype={problem.rhs_dtype} differ")
    plan = KernelPlan.of(arch, problem.to_dict(), config.to_dict())
    reasons = plan.violations()
    if reasons:
        raise ConfigInvalid("; ".join(reasons))
    return plan


class CompilerProcess:
    """One compile worker process for one arch, answering one request at a time (see compile_worker.py).

    Not thread-safe: a sweep gives each of its threads its own. A worker that dies or hangs fails the
    request in flight with CompileFailed and is replaced on the next request.
    """

    def __init__(self, arch: str, tools: toolchain.Toolchain | None = None) -> None:
        self.arch = arch
        self.tools = tools or toolchain.toolchain()
        self._proc: subprocess.Popen | None = None
        self._answers: queue.Queue = queue.Queue()

    def _start(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._answers = queue.Queue()
            self._proc = subprocess.Popen(
                [self.tools.python, str(WORKER)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=self.tools.env(self.arch),
            )
            stderr_tail: collections.deque[str] = collections.deque(maxlen=40)
            threading.Thread(target=self._pump, args=(self._proc, self._answers), daemon=True).start()
            self._stderr_reader = threading.Thread(
                target=_drain, args=(self._proc.stderr, stderr_tail), daemon=True
            )
            self._stderr_reader.start()
            self._stderr_tail = stderr_tail
        return self._proc

    @staticmethod
    def _pump(proc: subprocess.Popen, answers: queue.Queue) -> None:
        for line in proc.stdout:
            answers.put(line)
        answers.put(None)  # end of stream: the process has exited

    def request(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        proc = self._start()
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            line = self._answers.get(timeout=timeout_s)
        except queue.Empty:
            self.close()
            raise CompileFailed(f"compile took longer than {timeout_s:.0f} s") from None
        except OSError as e:  # the process died before reading the request
            line = None
            self._stderr_tail.append(str(e))
        if line is None:
            proc.wait(timeout=30)
            # The process has exited, so its stderr ends soon: let the reader take the last lines (the
            # reason it died) before quoting them.
            self._stderr_reader.join(timeout=10)
            tail = "".join(self._stderr_tail).strip()[-2000:]
            self._proc = None
            raise CompileFailed(f"compile worker exited with status {proc.returncode} and no result: {tail}")
        return json.loads(line)

    def close(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.stdin.close()
                try:
                    self._proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
            self._proc = None

    def __enter__(self) -> CompilerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _drain(stream, tail: collections.deque) -> None:
    for line in stream:
        tail.append(line)


def compile_one(
    problem: Problem,
    config: FlyDSLConfig,
    arch: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    process: CompilerProcess | None = None,
) -> CompileResult:
    """Compile one candidate in a worker process (`process`, or a fresh one that ends with the call).

    Raises ConfigInvalid, CompileFailed or ToolchainMissing.
    """
    plan = plan_for(problem, config, arch)
    if process is None:
        with CompilerProcess(arch) as fresh:
            return compile_one(problem, config, arch, timeout_s=timeout_s, process=fresh)
    if process.arch != arch:
        raise ValueError(f"a compiler process for {process.arch} cannot compile for {arch}")
    store = toolchain.cache_dir()
    fd, scratch = tempfile.mkstemp(suffix=".hsaco", dir=store, prefix=".compile-")
    os.close(fd)
    request = {"arch": arch, "problem": problem.to_dict(), "config": config.to_dict(), "out": scratch}
    started = time.perf_counter()
    try:
        answer = process.request(request, timeout_s)
        wall = time.perf_counter() - started
        if not answer.get("ok"):
            error = ConfigInvalid if answer.get("kind") == "config_invalid" else CompileFailed
            raise error(answer.get("error", "unknown compile error"))
        code = Path(scratch).read_bytes()
    finally:
        Path(scratch).unlink(missing_ok=True)
    digest = metadata.binary_hash(code)
    final = store / f"{digest}.hsaco"
    if not final.exists():
        staged = final.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        staged.write_bytes(code)
        os.replace(staged, final)
    metrics = metadata.kernel_metrics(code, answer["kernel_name"])
    return CompileResult(
        arch=arch,
        binary_hash=digest,
        hsaco_path=str(final),
        kernel_name=answer["kernel_name"],
        grid=plan.grid,
        block=plan.block,
        metrics=metrics,
        compile_s=float(answer["seconds"]),
        wall_s=wall,
        flydsl_version=str(answer.get("flydsl_version", "")),
    )


def prune_reason(result: CompileResult, config: FlyDSLConfig) -> str | None:
    """Why a compiled candidate is not worth timing (None: time it)."""
    return metadata.static_check(result.metrics, threads=result.block[0], waves_per_eu=config.waves_per_eu)


def compile_sweep(
    problem: Problem,
    arch: str,
    configs: Sequence[FlyDSLConfig],
    workers: int | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[SweepEntry]:
    """Compile every config for `arch` with `workers` processes at once; one entry per config, in order.

    A config the plan rejects is `pruned` before compiling; a compiled one is `pruned` when its
    metadata fails the static check; `compile_error` carries the compiler's message. Entries whose code
    object hashes like an earlier entry's point at it through `duplicate_of` and need no timing.
    ToolchainMissing is raised once, before anything runs, rather than recorded per config.
    """
    tools = toolchain.toolchain()
    workers = max(1, min(workers or os.cpu_count() or 1, len(configs)))
    local = threading.local()
    processes: list[CompilerProcess] = []

    def one(config: FlyDSLConfig) -> SweepEntry:
        if not hasattr(local, "process"):  # each pool thread keeps one worker process for the sweep
            local.process = CompilerProcess(arch, tools)
            processes.append(local.process)
        try:
            result = compile_one(problem, config, arch, timeout_s=timeout_s, process=local.process)
        except ConfigInvalid as e:
            return SweepEntry(config, PRUNED, str(e))
        except CompileFailed as e:
            return SweepEntry(config, COMPILE_ERROR, str(e))
        reason = prune_reason(result, config)
        return SweepEntry(config, PRUNED if reason else OK, reason or "", result)

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            entries = list(pool.map(one, configs))
    finally:
        for process in processes:
            process.close()
    first_by_hash: dict[str, int] = {}
    deduped = []
    for index, entry in enumerate(entries):
        if entry.status == OK and entry.result is not None:
            first = first_by_hash.setdefault(entry.result.binary_hash, index)
            if first != index:
                entry = dataclasses.replace(entry, duplicate_of=first)
        deduped.append(entry)
    return deduped
