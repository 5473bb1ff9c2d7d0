"""A simulated backend for driver tests: a synthetic search space whose "kernel times" come from a cost
table, and a runner that answers tasks from that table instead of compiling anything.

Registered only in tests, as "sim". Tests set `COSTS` (config -> seconds, or None for a candidate
that fails verification); configs missing from it cost `DEFAULT_COST`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from moetune.kernels.backend import Backend, StaticCompile
from moetune.kernels.config import KernelConfig
from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.space import SearchSpace
from moetune.tuner.tasks import OK, WRONG_RESULT, CandidateResult, CandidateTask, RetimeResult, Task, now

TILES = (1, 2, 3, 4, 5, 6, 7, 8)
DEFAULT_COST = 1e-3
COSTS: dict[int, float | None] = {}
HEURISTIC_TILE = 1


@dataclasses.dataclass(frozen=True, slots=True)
class SimConfig(KernelConfig):
    tile: int = 1


def tile_fits(problem, config: SimConfig, device) -> str | None:
    # A constraint like a real one: tiles beyond the problem's rows are pruned.
    return None if config.tile <= problem.m else f"tile={config.tile} > m={problem.m}"


class SimBackend(Backend):
    name = "sim"
    config_cls = SimConfig
    compiles_without_device = True
    compile_targets = ("sim-arch",)
    kernels = {"grouped_matmul": "build"}  # never built: the simulated runner replays results

    def available(self, device) -> str | None:
        return None

    def search_space(self, problem, device) -> SearchSpace:
        return SearchSpace(SimConfig, {"tile": TILES}, (tile_fits,))

    def heuristic(self, problem, device) -> SimConfig:
        return SimConfig(HEURISTIC_TILE)

    def source_hash(self) -> str:
        return "sim-v1"

    def build(self, problem, config):
        raise NotImplementedError("the simulated backend is only run by the simulated runner")

    def compile_only(self, problem, config: SimConfig, target: str) -> StaticCompile:
        """Tile 2 fails to compile, 3 breaks a plan rule, 4 spills (pruned after compiling), and tiles 5
        and 6 compile to the same binary."""
        if config.tile == 2:
            raise RuntimeError("simulated compiler crash")
        if config.tile == 3:
            raise ConfigInvalid("tile=3 breaks a simulated plan rule")
        binary = "b56" if config.tile in (5, 6) else f"b{config.tile}"
        pruned = "simulated: spills 12 registers" if config.tile == 4 else None
        return StaticCompile(binary, {"vgprs": 64 * config.tile}, 0.01, pruned)


BACKEND = SimBackend()


def cost(config: dict[str, Any]) -> float | None:
    return COSTS.get(config["tile"], DEFAULT_COST) if "tile" in config else DEFAULT_COST


def samples(seconds: float, runs: int) -> tuple[float, ...]:
    # A deterministic spread of +-0.2% around the cost: small, but not zero.
    return tuple(seconds * (1 + 0.002 * ((i % 5) - 2) / 2) for i in range(runs))


def simulate(task: Task) -> CandidateResult | RetimeResult:
    """The simulated runner: what a worker would answer, read from the cost table."""
    if isinstance(task, CandidateTask):
        seconds = cost(task.config)
        if seconds is None:
            return CandidateResult(task.task_id, WRONG_RESULT, error="simulated wrong result", worker="sim")
        return CandidateResult(
            task.task_id,
            OK,
            samples(seconds, task.runs),
            compile_s=0.01,
            verify_error=0.0,
            worker="sim",
            started_at=now(),
            finished_at=now(),
        )
    per_config = tuple(
        samples(cost(c) or DEFAULT_COST, task.rounds * task.runs_per_round) for c in task.configs
    )
    return RetimeResult(task.task_id, per_config, worker="sim")
