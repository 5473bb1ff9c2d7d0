"""The development shapes of fine-grained MoE models and their routings, for bench_gemm.py --models.

A model is (experts, top-k, hidden, expert FFN width). Per token count T, gate_up is the fused SwiGLU op
[T*k, hidden] x [G, hidden, 2F] -> [T*k, F] and down the plain GEMM [T*k, F] x [G, F, hidden]. Routing is
uniform random top-k: each token picks k distinct experts, so at T=1 exactly k experts have one row each.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from moetune.kernels.problem import GROUPED_MATMUL, GROUPED_MATMUL_SWIGLU, Problem


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    experts: int
    top_k: int
    hidden: int
    ffn: int


MODELS = {
    m.name: m
    for m in (
        Model("qwen3-30b-a3b", 128, 8, 2048, 768),
        Model("deepseek-v3", 256, 8, 7168, 2048),
        Model("deepseek-v3-ep8", 32, 8, 7168, 2048),  # one of 8 expert-parallel shards
        Model("qwen3-next-80b-a3b", 512, 10, 2048, 512),
        Model("mixtral-8x7b", 8, 2, 4096, 14336),
        # Hidden and FFN widths of 2880 (22.5 x 128): full-width tiles with a partial last step or tile.
        Model("gpt-oss-120b", 128, 4, 2880, 2880),
    )
}
TOKENS = (1, 16, 128, 1024, 4096, 16384)
GEMMS = ("gate_up", "down")


@dataclasses.dataclass(frozen=True)
class Case:
    model: Model
    gemm: str
    tokens: int

    @property
    def problem(self) -> Problem:
        m, model = self.tokens * self.model.top_k, self.model
        if self.gemm == "gate_up":
            return Problem(GROUPED_MATMUL_SWIGLU, m=m, k=model.hidden, n=2 * model.ffn, g=model.experts)
        return Problem(GROUPED_MATMUL, m=m, k=model.ffn, n=model.hidden, g=model.experts)

    @property
    def name(self) -> str:
        return f"{self.model.name}/{self.gemm}/T{self.tokens}"


def cases(models: list[str], tokens: tuple[int, ...] = TOKENS) -> list[Case]:
    """Model by model, both GEMMs, tokens ascending: one model's weights serve its cases in a row."""
    return [Case(MODELS[name], gemm, t) for name in models for gemm in GEMMS for t in tokens]


def top_k_group_sizes(case: Case, seed: int) -> list[int]:
    """Rows per expert when each of T tokens picks top_k distinct experts uniformly at random."""
    rng = np.random.default_rng(seed)
    g, k = case.model.experts, case.model.top_k
    picks = np.argpartition(rng.random((case.tokens, g)), k - 1, axis=1)[:, :k]
    return np.bincount(picks.ravel(), minlength=g).astype(int).tolist()


def routings(case: Case, min_bytes: int, most: int = 16) -> list[list[int]]:
    """Routings enough that the weights they touch, together, exceed `min_bytes` (twice the L2): at T=1
    one routing's 8 experts of Qwen3's down (25 MB) would stay in L2 across timed runs."""
    p = case.problem
    sets = []
    touched: set[int] = set()
    while len(sets) < most:
        sizes = top_k_group_sizes(case, seed=len(sets))
        sets.append(sizes)
        touched |= {i for i, s in enumerate(sizes) if s}
        if len(touched) * p.k * p.n * 2 >= min_bytes or len(touched) == p.g:
            break
    return sets
