"""The grouped GEMMs a MaxText config runs on one shard, as tuning problems (`moetune tune --maxtext-config`).

MaxText's MoE decides the shapes of its GEMMs from many settings at once: the experts a shard holds
(expert parallelism), each expert's ffn on a shard (tensor parallelism), gate and up weights fused or not
(prefuse_moe_weights), the all-to-all's receive buffer (expert parallelism times a shard's rows unless
ragged_buffer_factor bounds it), ring of experts, and the rows padded to megablox's tile
(wi_tile_fwd_batch_seq). Rather than re-derive them, the problems are what MaxText's own RoutedMoE
layer dispatches when it is traced with the plug-in installed (trace.py): jax.eval_shape, so no weight is
made and nothing runs. The trace needs a device mesh of the config's shape, so it runs in a child process
on that many CPU devices (XLA's host platform), leaving the calling process's jax as it was.

Workloads, each traced at one shard's token count:

    train     per_device_batch_size x max_target_length tokens, forward and backward (dlhs, drhs)
    prefill   per_device_batch_size x max_prefill_predict_length tokens, forward
    decode    per_device_batch_size tokens (one step), forward

Where a workload's layer has at most 32 tokens (the whole batch) and settings the fused decode block
computes, the block's problem (op moe_decode_block, m = those tokens) is planned as well, unless expert
parallelism splits the experts (the block's winners are for whole layers): the plug-in runs the block
there once a sweep timed it faster than MaxText's path (decode_mode 'auto', decode.py).

A problem's m is the rows its lhs has, padding and receive buffer included (what dispatch looks up);
`filled_rows` is the rows its groups hold on average, the shard's tokens times top_k (times the tensor
parallel degree, whose ranks each compute all of their tokens' rows), which the sweep's routings fill.
Example: DeepSeek-V3 at ici_expert_parallelism=8, per_device_batch_size=2, max_target_length=4096 trains
on a receive buffer of m=524288 rows of which 65536 are filled on average.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.problem import Problem

WORKLOADS = ("train", "prefill", "decode")
# A trace imports MaxText (about ten seconds) and traces one layer per workload (under a second each).
TRACE_TIMEOUT_S = 600.0
_OVERRIDE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*=.*")
# The last line a trace prints: its result or its one-line error, as JSON.
RESULT_PREFIX = "moetune-maxtext-trace: "


@dataclasses.dataclass(frozen=True)
class TracedProblem:
    """One GEMM a traced workload dispatched: its Problem, a label ("<config> train T=64 wi forward"), the
    shard's tokens T, and the rows its groups fill (fewer than m where MaxText pads its buffers). The
    tuner plans it as a PlannedProblem of the same fields; the integration stays below the tuner."""

    problem: Problem
    label: str
    tokens: int
    filled_rows: int | None  # None: the problem's own rows (the fused decode block routes its tokens)

    def to_dict(self) -> dict[str, Any]:
        return {"problem": self.problem.to_dict(), "label": self.label, "tokens": self.tokens,
                "filled_rows": self.filled_rows}  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TracedProblem:
        return cls(
            Problem.from_dict(data["problem"]), str(data["label"]), data["tokens"], data["filled_rows"]
        )


@dataclasses.dataclass(frozen=True)
class Target:
    """A MaxText config to tune for: its YAML, the key=value overrides its command line would add (as
    MaxText's own train and decode commands take them), the devices of its mesh (None: the product of the
    config's positive ici_* and dcn_* parallelisms) and the workloads to trace."""

    config: str
    overrides: tuple[str, ...] = ()
    devices: int | None = None
    workloads: tuple[str, ...] = WORKLOADS

    def __post_init__(self) -> None:
        object.__setattr__(self, "overrides", tuple(self.overrides))
        object.__setattr__(self, "workloads", tuple(self.workloads))
        if not isinstance(self.config, str) or not self.config:
            raise ConfigInvalid(f"MaxText config {self.config!r} is not a path")
        for item in self.overrides:
            if not isinstance(item, str) or not _OVERRIDE.fullmatch(item):
                raise ConfigInvalid(f"MaxText override {item!r} is not key=value")
        devices = self.devices
        if devices is not None and (isinstance(devices, bool) or not isinstance(devices, int) or devices < 1):
            raise ConfigInvalid(f"MaxText devices={devices!r} must be a positive integer")
        unknown = sorted(set(self.workloads) - set(WORKLOADS))
        if unknown or not self.workloads:
            raise ConfigInvalid(
                f"MaxText workloads {list(self.workloads)!r}: choose from {', '.join(WORKLOADS)}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "overrides": list(self.overrides),
            "devices": self.devices,
            "workloads": list(self.workloads),
        }

    @classmethod
    def from_dict(cls, data: Any, source: str = "maxtext") -> Target:
        if not isinstance(data, dict) or "config" not in data:
            raise ConfigInvalid(f"{source}: a mapping with config (and overrides, devices, workloads)")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigInvalid(
                f"{source}: unknown fields {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        for name in ("overrides", "workloads"):
            if name in data and not isinstance(data[name], (list, tuple)):
                raise ConfigInvalid(f"{source}: {name} must be a list")
        config = data["config"]
        if isinstance(config, str):
            config = str(Path(config).expanduser().resolve())
        return cls(**{**data, "config": config})


def planned_problems(target: Target) -> list[TracedProblem]:
    """The problems of `target` (module docstring), from a trace in a child process, traced once per
    process (a sweep asks before it opens anything, and again when it plans). Raises ConfigInvalid with
    the trace's one-line reason when MaxText refuses the config or the plug-in cannot serve it."""
    return list(_traced(target))


@functools.cache
def _traced(target: Target) -> tuple[TracedProblem, ...]:
    if not Path(target.config).is_file():
        raise ConfigInvalid(f"MaxText config {target.config}: not a file")
    command = [sys.executable, "-m", "moetune.integrations.maxtext.trace", json.dumps(target.to_dict())]
    # The child's jax runs on CPU devices only, whatever this machine has.
    env = os.environ | {"JAX_PLATFORMS": "cpu"}
    try:
        # In a folder of its own: whatever MaxText leaves behind (its default output folder) goes with it.
        with tempfile.TemporaryDirectory(prefix="moetune-maxtext-") as folder:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=TRACE_TIMEOUT_S, env=env, cwd=folder
            )
    except subprocess.TimeoutExpired:
        took = f"tracing MaxText's MoE took over {TRACE_TIMEOUT_S:.0f} s"
        raise ConfigInvalid(f"{target.config}: {took}") from None
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigInvalid(f"{target.config}: the MaxText trace failed (exit {done.returncode}): {tail}")
    result = json.loads(lines[-1].removeprefix(RESULT_PREFIX))
    if "error" in result:
        raise ConfigInvalid(f"{target.config}: {result['error']}")
    return tuple(TracedProblem.from_dict(item) for item in result["problems"])
