"""Where a search starts: configs known to be good before the first trial, and the XLA baseline.

Order: the backend's heuristic default (so the table can show what tuning gained over it), the current
winner of this problem on this device, then winners of the same shape at the nearest token counts
(neighbouring M), including stale ones from an older driver or kernel source: a good tile for M=4096
is rarely bad at M=8192; last the search space's seeds (the backend's other preferred configs). Configs
that the current space forbids are dropped by the strategy.
"""

from __future__ import annotations

import math
from typing import Any

from moetune.kernels.backend import Backend
from moetune.kernels.config import KernelConfig
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import ConfigInvalid, Unsupported
from moetune.kernels.problem import Problem

# Winners of other token counts to start from: the nearest ones, below and above.
NEIGHBOURS = 4
# The backend whose `baseline_config` every speedup is measured against.
BASELINE_BACKEND = "xla"


def baseline_config() -> dict[str, Any]:
    """XLA's own ragged_dot as a config of the xla backend: the baseline every speedup is measured against."""
    from moetune.kernels.backends.xla.config import XlaConfig

    return XlaConfig(strategy="ragged_dot").to_dict()


def warm_start_configs(
    store: Any,
    backend: Backend,
    problem: Problem,
    device: DeviceFingerprint,
    seeds: tuple[KernelConfig, ...] = (),
) -> tuple[list[KernelConfig], KernelConfig | None]:
    """(configs to try first, the heuristic default or None if the backend has none for this problem)."""
    try:
        heuristic = backend.heuristic(problem, device)
    except (ConfigInvalid, Unsupported):
        heuristic = None
    configs: list[KernelConfig] = [heuristic] if heuristic is not None else []
    winner = store.current_winner(fingerprint_hash=device.hash, backend=backend.name, problem_key=problem.key)
    related = store.winners(device_kind=device.device_kind, backend=backend.name, shape_key=problem.shape_key)

    def distance(row: Any) -> tuple[float, bool]:
        return abs(math.log2(row.problem.m) - math.log2(problem.m)), row.fingerprint_hash != device.hash

    rows = ([winner] if winner is not None else []) + sorted(related, key=distance)[:NEIGHBOURS]
    for row in rows:
        try:
            configs.append(backend.config_class(problem.op).from_dict(row.config))
        except (ConfigInvalid, TypeError):  # a winner of an older Config schema
            continue
    return list(dict.fromkeys([*configs, *seeds])), heuristic
