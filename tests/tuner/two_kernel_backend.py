"""A simulated backend whose op is two kernels run one after another, each set by its own parameter: `a`
sets kernel "first", `b` kernel "second" (SearchSpace.kernels). Registered only in tests, as
"two_kernel". Its runner answers each candidate with the two kernels' times from `FIRST` and `SECOND`
(parameter value -> seconds) and their sum as the samples, as a CUPTI timer would.
"""

from __future__ import annotations

import dataclasses

from moetune.kernels.backend import Backend
from moetune.kernels.config import KernelConfig
from moetune.kernels.space import SearchSpace
from moetune.tuner.tasks import OK, CandidateResult, CandidateTask, RetimeResult, Task, now

VALUES = (1, 2, 3, 4)
FIRST = {1: 4e-3, 2: 3e-3, 3: 2e-3, 4: 1e-3}  # kernel "first" is fastest at a=4
SECOND = {1: 4e-3, 2: 3e-3, 3: 2e-3, 4: 1e-3}  # kernel "second" is fastest at b=4
FORBIDDEN: set[tuple[int, int]] = set()  # (a, b) pairs a rule of the space forbids


@dataclasses.dataclass(frozen=True, slots=True)
class TwoKernelConfig(KernelConfig):
    a: int = 1
    b: int = 1


def allowed(problem, config: TwoKernelConfig, device) -> str | None:
    return f"a={config.a}, b={config.b} is forbidden" if (config.a, config.b) in FORBIDDEN else None


class TwoKernelBackend(Backend):
    name = "two_kernel"
    config_cls = TwoKernelConfig
    kernels = {"grouped_matmul": "build"}  # never built: the simulated runner answers

    def available(self, device) -> str | None:
        return None

    def search_space(self, problem, device) -> SearchSpace:
        return SearchSpace(
            TwoKernelConfig,
            {"a": VALUES, "b": VALUES},
            (allowed,),
            validity=(allowed,),
            kernels={"first": ("a",), "second": ("b",)},
        )

    def heuristic(self, problem, device) -> TwoKernelConfig:
        return TwoKernelConfig(4, 1)  # the first kernel's best, the second's worst

    def source_hash(self) -> str:
        return "two-kernel-v1"

    def build(self, problem, config):
        raise NotImplementedError("the simulated backend is only run by its simulated runner")


BACKEND = TwoKernelBackend()


def _times(config: dict) -> tuple[tuple[str, float], ...]:
    """The two kernels' seconds for a config of this backend; the sweep's XLA baseline costs 1 s."""
    if "a" not in config:
        return (("baseline", 1.0),)
    return (("first", FIRST[config["a"]]), ("second", SECOND[config["b"]]))


def simulate(task: Task) -> CandidateResult | RetimeResult:
    if isinstance(task, CandidateTask):
        kernels = _times(task.config)
        return CandidateResult(
            task.task_id,
            OK,
            (sum(seconds for _, seconds in kernels),) * task.runs,
            compile_s=0.01,
            verify_error=0.0,
            worker="sim",
            started_at=now(),
            finished_at=now(),
            kernels=kernels,
        )
    totals = tuple(
        (FIRST[c["a"]] + SECOND[c["b"]],) * (task.rounds * task.runs_per_round) for c in task.configs
    )
    return RetimeResult(task.task_id, totals, worker="sim")
