"""The FlyDSL kernel's tunables: a frozen Config checked for its own rules at construction.

Rules that need the problem or the target arch (divisibility by K and N, the MFMA K of the arch, the LDS
limit) live in KernelPlan.violations() (plan.py), which the search space, build() and the compile
worker all call.
"""

from __future__ import annotations

import dataclasses

from moetune.kernels.config import KernelConfig
from moetune.kernels.errors import ConfigInvalid

TILE_ORDERS = ("m_major", "n_major")
MFMA_SIZES = (16, 32)


def _pow2(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


@dataclasses.dataclass(frozen=True, slots=True)
class FlyDSLConfig(KernelConfig):
    """One point of the FlyDSL grouped-GEMM space.

    tile_m, tile_n, tile_k: the workgroup's output tile and K step. waves_m x waves_n waves share the
    output tile; k_waves groups of them split each K tile and add their partials at the end (k-wave
    split). lds_stages: 1 (single buffer, two barriers per K tile) or 2 (double buffer, one barrier).
    waves_per_eu: occupancy hint to LLVM (0: the compiler's choice). xcd_swizzle: number of XCDs to
    renumber workgroups over so neighbouring tiles share an XCD's L2 (0: off). tile_order: m_major walks
    an expert's row tiles across all N tiles first; n_major walks N tiles in the outer loop.
    mfma: 16 for 16x16xK MFMAs, 32 for 32x32xK. lds_swizzle: XOR-swizzle LDS rows (bank conflicts).
    """

    tile_m: int = 128
    tile_n: int = 128
    tile_k: int = 64
    waves_m: int = 2
    waves_n: int = 2
    k_waves: int = 1
    lds_stages: int = 2
    waves_per_eu: int = 0
    xcd_swizzle: int = 0
    tile_order: str = "m_major"
    mfma: int = 16
    lds_swizzle: bool = True

    def validate(self) -> None:
        for name in ("tile_m", "tile_n", "tile_k", "waves_m", "waves_n", "k_waves"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not _pow2(value):
                raise ConfigInvalid(f"{name}={value!r} must be a positive power of two")
        if not 16 <= self.tile_m <= 256 or not 16 <= self.tile_n <= 256:
            raise ConfigInvalid(f"tile_m={self.tile_m}, tile_n={self.tile_n} must lie in [16, 256]")
        if not 16 <= self.tile_k <= 256:
            raise ConfigInvalid(f"tile_k={self.tile_k} must lie in [16, 256]")
        if self.waves_m * self.waves_n * self.k_waves > 16:
            raise ConfigInvalid(
                f"waves_m*waves_n*k_waves={self.waves_m * self.waves_n * self.k_waves} > 16 waves "
                "(1024 threads)"
            )
        if self.lds_stages not in (1, 2):
            raise ConfigInvalid(f"lds_stages={self.lds_stages} must be 1 or 2")
        if not isinstance(self.waves_per_eu, int) or not 0 <= self.waves_per_eu <= 8:
            raise ConfigInvalid(
                f"waves_per_eu={self.waves_per_eu!r} must lie in [0, 8] (0: compiler default)"
            )
        if not isinstance(self.xcd_swizzle, int) or self.xcd_swizzle < 0 or self.xcd_swizzle == 1:
            raise ConfigInvalid(f"xcd_swizzle={self.xcd_swizzle!r} must be 0 (off) or a number of XCDs >= 2")
        if self.tile_order not in TILE_ORDERS:
            raise ConfigInvalid(f"tile_order={self.tile_order!r} is not one of {', '.join(TILE_ORDERS)}")
        if self.mfma not in MFMA_SIZES:
            raise ConfigInvalid(f"mfma={self.mfma!r} is not one of {MFMA_SIZES}")
        if not isinstance(self.lds_swizzle, bool):
            raise ConfigInvalid(f"lds_swizzle={self.lds_swizzle!r} must be a bool")
