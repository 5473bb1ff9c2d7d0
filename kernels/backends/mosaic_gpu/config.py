"""The mosaic_gpu backend's tunables: one frozen, hashable value per kernel variant.

Tile sizes are per consumer warpgroup. With `wg_split="m"` (or "n") two consumer warpgroups share one
CTA and the CTA tile is twice `block_m` (or `block_n`); with "none" one warpgroup computes the whole
tile. `block_m` always counts token rows and `block_n` weight columns; a block_m below wgmma's 64 rows
puts the tokens on wgmma's narrow N side (`swap_ab`). Rules that need the problem or the device
(divisibility by K and N, shared memory, registers) are constraints in
`space.py` beside it; only config-only rules live here.
"""

from __future__ import annotations

import dataclasses

from moetune.kernels.config import KernelConfig
from moetune.kernels.errors import ConfigInvalid

GRID_MINOR_DIMS = ("m", "n", "expert")
WG_SPLITS = ("none", "m", "n")
TILE_SCHEDULES = ("walk", "table")
# wgmma's fixed M: the rows of its A operand per instruction.
WGMMA_M = 64
# The epilogue's row chunk; under swap_ab it is unused and must stay at this default.
DEFAULT_EPI_TILE_M = 64


@dataclasses.dataclass(frozen=True, slots=True)
class MosaicGpuConfig(KernelConfig):
    """One variant of the Hopper grouped GEMM.

    block_m, block_n, block_k: the tile one consumer warpgroup computes per pipeline step.
    max_concurrent_steps: pipeline depth (shared-memory stages in flight).
    grid_minor_dim, grid_tile_width: tile order for L2 reuse; tiles are visited in strips of
        `grid_tile_width` along `grid_minor_dim`, snaking back and forth (plgpu.planar_snake). "expert"
        walks one expert's tiles after another, in strips of its own row tiles, so that no strip mixes
        two experts' weights.
    persistent: one CTA per SM looping over tiles, or one CTA per tile.
    warp_specialized: a producer warpgroup issues the copies while consumer warpgroups multiply.
    wg_split: two consumer warpgroups along "m" or "n", or one ("none"); needs warp_specialized.
    epi_tile_m, epi_tile_n: the block written per epilogue step (registers -> shared memory -> TMA).
    split_k: the K range split over this many CTAs, partial sums in float32 added afterwards (decode).
    pad_lhs: when M fits in one CTA tile, pad lhs to the tile's rows first, so that no lhs copy reads
        past its end (TMA zero-fills those rows, which slowed the H200's T=1 weight stream); the pad is
        an XLA op, free where it fuses into the op that makes lhs and a copy where it does not.
    tile_schedule: how a row tile finds its expert. "walk": by walking all G groups in the kernel,
        unrolled, in every tile (code, compile time and per-tile work grow with G; every config tuned
        before "table" existed lowers exactly as it did). "table": from a table of row tiles an XLA
        prologue builds once per call from group_sizes (one load per tile whatever G; see schedule.py).
    stagger_consumers: the two consumer warpgroups take turns at the tensor cores, half a K step apart:
        each issues a step's wgmmas only after the other has issued its own, so that one promotes FP8
        block scales on the CUDA cores while the other's wgmmas run (without it both wait on the same
        stage and promote at once, the tensor cores idle meanwhile). Needs two consumers.

    A block_m of 8-56 rows (a multiple of 8) is swap-AB (`swap_ab`): the weights are wgmma's A operand
    (64 of their columns per instruction) and the token rows its narrow N side, so that a tile of a few
    tokens multiplies no padding rows. The accumulator is the output tile transposed and is stored
    through a transposed shared-memory view; the epilogue writes all block_m rows of 64 columns at once
    (epi_tile_n 64; epi_tile_m plays no part and stays at its default); no split-K, a 16-bit output.
    """

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    max_concurrent_steps: int = 4
    grid_minor_dim: str = "m"
    grid_tile_width: int = 8
    persistent: bool = True
    warp_specialized: bool = True
    wg_split: str = "n"
    epi_tile_m: int = DEFAULT_EPI_TILE_M
    epi_tile_n: int = 64
    split_k: int = 1
    pad_lhs: bool = False
    tile_schedule: str = "walk"
    stagger_consumers: bool = False

    def validate(self) -> None:
        ints = ("block_m", "block_n", "block_k", "max_concurrent_steps", "grid_tile_width", "split_k")
        for name in (*ints, "epi_tile_m", "epi_tile_n"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigInvalid(f"{name}={value!r} must be an integer")
        for name in ("persistent", "warp_specialized", "pad_lhs", "stagger_consumers"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigInvalid(f"{name}={getattr(self, name)!r} must be a bool")
        if self.tile_schedule not in TILE_SCHEDULES:
            raise ConfigInvalid(f"tile_schedule={self.tile_schedule!r} is not one of {TILE_SCHEDULES}")
        # wgmma computes 64 rows per warpgroup instruction; fewer token rows go on its N side (swap-AB),
        # which takes multiples of 8 (and lhs tiles are tiled by 8 rows).
        if self.block_m not in (*range(8, WGMMA_M, 8), 64, 128, 192, 256):
            raise ConfigInvalid(
                f"block_m={self.block_m} is not a multiple of 8 below 64, nor 64, 128, 192, 256"
            )
        if self.swap_ab:
            self._validate_swapped()
        # 64 columns of 16-bit data fill one 128-byte swizzle atom of the TMA copies.
        if self.block_n % 64 or not 64 <= self.block_n <= 256:
            raise ConfigInvalid(f"block_n={self.block_n} is not a multiple of 64 in [64, 256]")
        if self.block_k % 32 or not 32 <= self.block_k <= 256:
            raise ConfigInvalid(f"block_k={self.block_k} is not a multiple of 32 in [32, 256]")
        if not 2 <= self.max_concurrent_steps <= 8:
            raise ConfigInvalid(f"max_concurrent_steps={self.max_concurrent_steps} is not in [2, 8]")
        if self.grid_minor_dim not in GRID_MINOR_DIMS:
            raise ConfigInvalid(f"grid_minor_dim={self.grid_minor_dim!r} is not one of {GRID_MINOR_DIMS}")
        if self.grid_tile_width < 1:
            raise ConfigInvalid(f"grid_tile_width={self.grid_tile_width} must be >= 1")
        if self.wg_split not in WG_SPLITS:
            raise ConfigInvalid(f"wg_split={self.wg_split!r} is not one of {WG_SPLITS}")
        if self.wg_split != "none" and not self.warp_specialized:
            raise ConfigInvalid(f"wg_split={self.wg_split!r} needs warp_specialized=True")
        if self.stagger_consumers and self.wg_split == "none":
            raise ConfigInvalid("stagger_consumers needs two consumer warpgroups (wg_split 'm' or 'n')")
        if self.epi_tile_n % 32 or self.block_n % self.epi_tile_n:
            raise ConfigInvalid(
                f"epi_tile_n={self.epi_tile_n} must be a multiple of 32 dividing block_n={self.block_n}"
            )
        # Row slices of the wgmma accumulator are whole 64-row instruction tiles.
        if not self.swap_ab and (self.epi_tile_m % WGMMA_M or self.block_m % self.epi_tile_m):
            raise ConfigInvalid(
                f"epi_tile_m={self.epi_tile_m} must be a multiple of 64 dividing block_m={self.block_m}"
            )
        if self.split_k < 1:
            raise ConfigInvalid(f"split_k={self.split_k} must be >= 1")

    def _validate_swapped(self) -> None:
        # Two consumers would split the token rows, which are the narrow side already.
        if self.wg_split == "m":
            raise ConfigInvalid("wg_split='m' cannot split the token rows under swap_ab; use 'n' or 'none'")
        # The transposed store into shared memory lowers for 16-bit values only (jax 0.11.2: Mosaic GPU
        # infers no layout for a float32 one), and split-K stores float32 partial sums.
        if self.split_k != 1:
            raise ConfigInvalid(f"split_k={self.split_k}: swap_ab stores 16-bit tiles only; use split_k=1")
        # The accumulator's rows are output columns: an epilogue chunk is one 64-row wgmma tile, which is
        # also the widest transposed store Mosaic GPU lays out (128 columns fail its layout inference).
        if self.epi_tile_n != WGMMA_M:
            raise ConfigInvalid(f"epi_tile_n={self.epi_tile_n} must be 64 under swap_ab")
        if self.epi_tile_m != DEFAULT_EPI_TILE_M:
            raise ConfigInvalid(
                f"epi_tile_m={self.epi_tile_m}: under swap_ab every row leaves at once; leave it at "
                f"{DEFAULT_EPI_TILE_M}"
            )

    @property
    def swap_ab(self) -> bool:
        """Whether the tokens are wgmma's N side and the weights its A operand (block_m below 64)."""
        return self.block_m < WGMMA_M

    @property
    def consumers(self) -> int:
        """Consumer (MMA) warpgroups per CTA."""
        return 1 if self.wg_split == "none" else 2

    @property
    def cta_m(self) -> int:
        return self.block_m * (2 if self.wg_split == "m" else 1)

    @property
    def cta_n(self) -> int:
        return self.block_n * (2 if self.wg_split == "n" else 1)
