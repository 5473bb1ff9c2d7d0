"""Routings: how the M rows of a grouped GEMM fall onto G experts (the group sizes).

Group sizes are runtime data, so every candidate of one problem is timed on the same representative
draw, and the draw is stored with the trial. Evenly split groups benchmark unrealistically fast (every
tile is full and no expert is idle), so skewed draws matter:

    balanced        M // G rows per expert (the remainder to the first experts)
    zipf:S          expert ranks drawn with P(rank r) ~ 1 / r**S over a random expert order; zipf:0 is a
                    uniform multinomial draw (near-balanced, ragged counts, like a trained router's)
    FILE.npy        expert ids recorded from a real model, int array [T, top_k]; a draw takes M
                    consecutive ids from a random offset (wrapping around)
    A,B             several routings (e.g. "balanced,zipf:1.2"): every candidate is timed on each, and
                    its time is their mean, so one winner serves both (group sizes are not in the key)

The driver computes all group sizes and ships them inside tasks, so workers never read routing files.

An op that routes its tokens itself (the fused MoE decode block, `OpSpec.routed`) takes no group sizes
but a router's logits, made from each draw (OpSpec.expert_capacity): its draws spread each token's top_k
choices over the experts with at most one per token on an expert (`capacity`, the token count), and leave
no row out, as a router leaves no token unrouted.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import numpy as np

from moetune.kernels.errors import ConfigInvalid


@dataclasses.dataclass(frozen=True)
class Routing:
    kind: str  # "balanced" | "zipf" | "recorded"
    s: float = 0.0
    path: str = ""

    @classmethod
    def parse(cls, text: str) -> Routing:
        text = text.strip()
        if text == "balanced":
            return cls("balanced")
        if text.startswith("zipf:"):
            try:
                s = float(text.removeprefix("zipf:"))
            except ValueError:
                raise ConfigInvalid(
                    f"routing {text!r}: zipf exponent is not a number (e.g. zipf:1.2)"
                ) from None
            if not s >= 0:
                raise ConfigInvalid(f"routing {text!r}: zipf exponent must be >= 0")
            return cls("zipf", s=s)
        if text.endswith(".npy"):
            path = Path(text).expanduser().resolve()
            _load_recorded(str(path))  # fail now, with the reason, not in the middle of a sweep
            return cls("recorded", path=str(path))
        raise ConfigInvalid(
            f"routing {text!r} is not balanced, zipf:S or a FILE.npy of expert ids [T, top_k]"
        )

    def __str__(self) -> str:
        return {"balanced": "balanced", "zipf": f"zipf:{self.s:g}", "recorded": self.path}[self.kind]

    def group_sizes(self, m: int, g: int, *, seed: int, capacity: int | None = None) -> np.ndarray:
        """int32 [g] summing to m, none above `capacity` when given (`capped`)."""
        rng = np.random.default_rng(seed)
        if self.kind == "balanced":
            sizes = np.full(g, m // g, dtype=np.int64)
            sizes[: m % g] += 1
        elif self.kind == "zipf":
            weights = 1.0 / np.arange(1, g + 1, dtype=np.float64) ** self.s
            probabilities = weights[rng.permutation(g)] / weights.sum()
            sizes = rng.multinomial(m, probabilities)
        else:
            ids = _load_recorded(self.path).reshape(-1)
            if int(ids.max()) >= g:
                raise ConfigInvalid(f"routing file {self.path} has expert id {int(ids.max())} >= g={g}")
            start = int(rng.integers(len(ids)))
            window = np.take(ids, np.arange(start, start + m), mode="wrap")
            sizes = np.bincount(window, minlength=g)
        if capacity is not None:
            sizes = capped(sizes, capacity, rng)
        return sizes.astype(np.int32)


def capped(
    sizes: np.ndarray, capacity: int, rng: np.random.Generator, *, empty: int | None = None
) -> np.ndarray:
    """`sizes` with at most `capacity` rows on an expert (and none on expert `empty`, when given): the rows
    above it move, in order, to the experts with room, visited in a random order (a skewed draw stays
    skewed: its largest experts stay full). Example, capacity 2: [4, 0, 1, 1] -> [2, 1, 2, 1] or
    [2, 2, 1, 1], as the order visits them."""
    sizes = np.asarray(sizes, dtype=np.int64)
    open_experts = len(sizes) - (empty is not None)
    if int(sizes.sum()) > capacity * open_experts:
        raise ConfigInvalid(
            f"{int(sizes.sum())} rows do not fit {open_experts} experts of at most {capacity}"
        )
    room = np.full(len(sizes), capacity)
    if empty is not None:
        room[empty] = 0
    excess = int(np.maximum(sizes - room, 0).sum())
    sizes = np.minimum(sizes, room)
    for expert in rng.permutation(len(sizes)):
        if not excess:
            break
        moved = min(int(room[expert] - sizes[expert]), excess)
        sizes[expert] += moved
        excess -= moved
    return sizes


def parse_routings(text: str) -> tuple[Routing, ...]:
    """One routing or several, comma-separated ("balanced,zipf:1.2"); each at most once."""
    parts = [part for part in (p.strip() for p in text.split(",")) if part]
    if not parts:
        raise ConfigInvalid("routing is empty; use balanced, zipf:S, FILE.npy or several, comma-separated")
    routings = tuple(Routing.parse(part) for part in parts)
    if len(set(routings)) != len(routings):
        raise ConfigInvalid(f"routing {text!r} names the same routing twice")
    return routings


def describe_routings(routings: tuple[Routing, ...], draws: list[np.ndarray], *, seed: int) -> dict[str, Any]:
    """What a trial row keeps about the routings it was timed on: one list of group sizes per routing."""
    return {
        "routing": ",".join(str(r) for r in routings),
        "seed": seed,
        "group_sizes": [[int(x) for x in sizes] for sizes in draws],
    }


def verification_draws(
    routings: tuple[Routing, ...], m: int, g: int, *, seed: int, count: int, capacity: int | None = None
) -> list[np.ndarray]:
    """Group sizes to verify a candidate on: each routing's timing draw first, then draws that stress the
    edges (at least one, and `count` draws in all when that is more).

    The extra draws are uniformly random and leave the last rows unassigned (as a padded token bucket
    does), so the check that rows past sum(group_sizes) are zero has rows to look at; alternate draws
    also leave one expert empty. With a `capacity` (a router's draws: module docstring) every row is
    assigned, at most `capacity` to an expert, and an expert is left empty only where the others hold
    every row.
    """
    if count < 2:
        raise ConfigInvalid(f"verify_draws={count}: verify on at least two routing draws")
    draws = [routing.group_sizes(m, g, seed=seed, capacity=capacity) for routing in routings]
    rng = np.random.default_rng(seed + 1)
    edge_draws = max(1, count - len(draws))
    for i in range(1, edge_draws + 1):
        assigned = m - max(1, m // 8) if m > 1 and capacity is None else m
        probabilities = np.full(g, 1.0 / g)
        empty = None
        if g > 1 and i % 2 == 1 and (capacity is None or capacity * (g - 1) >= m):
            empty = int(rng.integers(g))
            probabilities[empty] = 0.0
            probabilities /= probabilities.sum()
        sizes = rng.multinomial(assigned, probabilities)
        if capacity is not None:
            sizes = capped(sizes, capacity, rng, empty=empty)
        draws.append(sizes.astype(np.int32))
    return draws


@functools.cache
def _load_recorded(path: str) -> np.ndarray:
    try:
        ids = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise ConfigInvalid(f"cannot read routing file {path}: {e}") from e
    if ids.ndim != 2 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ConfigInvalid(
            f"routing file {path} holds {ids.dtype}{list(ids.shape)}; expected integer expert ids [T, top_k]"
        )
    if int(ids.min()) < 0:
        raise ConfigInvalid(f"routing file {path} has a negative expert id {int(ids.min())}")
    return ids
