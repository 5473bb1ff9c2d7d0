"""The `xla` backend's tunables: which formulation of the grouped GEMM XLA compiles, and its chunking.

Strategies (kernel.py has one function each):
  ragged_dot    jax.lax.ragged_dot as is: XLA's own lowering.
  dense_masked  every expert for every row ([M, G, N] products), then each row keeps its own expert's row.
  segments      a loop over experts; step g multiplies all rows by expert g and keeps the rows of group g.
  chunked       rows in chunks of `chunk_m`; one work item per (chunk, group) overlap, each with a gather of
                its expert's weights; `items_per_step` work items are multiplied per loop step.

`chunk_m` and `items_per_step` only mean something for `chunked`; the search space pins them to their
defaults for the other strategies (space.py), so each distinct kernel is tried once.
"""

from __future__ import annotations

import dataclasses

from moetune.kernels.config import KernelConfig
from moetune.kernels.errors import ConfigInvalid

STRATEGIES = ("ragged_dot", "dense_masked", "segments", "chunked")
DEFAULT_CHUNK_M = 128
DEFAULT_ITEMS_PER_STEP = 8


@dataclasses.dataclass(frozen=True, slots=True)
class XlaConfig(KernelConfig):
    strategy: str = "ragged_dot"
    chunk_m: int = DEFAULT_CHUNK_M
    items_per_step: int = DEFAULT_ITEMS_PER_STEP

    def validate(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigInvalid(f"strategy={self.strategy!r} is not one of {', '.join(STRATEGIES)}")
        for name in ("chunk_m", "items_per_step"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigInvalid(f"{name}={value!r} must be a positive integer")
        # Multiples of 8 keep row chunks aligned to the sublane/vector width on every target.
        if self.chunk_m % 8:
            raise ConfigInvalid(f"chunk_m={self.chunk_m} is not a multiple of 8")
