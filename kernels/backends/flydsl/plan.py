"""Launch plan of the FlyDSL grouped-GEMM kernel: pure arithmetic shared by the compile worker and the host.

This module imports only the standard library, because two different interpreters load it: the compile
worker (Python 3.11 with flydsl and torch, see compile.py) builds the kernel from a plan, and the main
moetune process (Python 3.12 with jax) uses the same plan for the grid, the kernel arguments and the
search-space constraints. One function computes each number, so the launcher and the kernel cannot
disagree about the grid or the tile count.

Work decomposition (see kernel.py): the grid is one dimension of `m_slots * n_tiles` workgroups, where
`m_slots = ceil(M / tile_m) + G` bounds the number of row tiles of any routing: each of the G groups and
the tail past sum(group_sizes) adds at most one partial tile. Example: M=10, tile_m=4, G=2, sizes (5, 3):
group 0 takes tiles [0,4) [4,5), group 1 [5,8), the tail rows [8,10) one tile: 4 <= ceil(10/4)+2 = 5.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

WAVE_SIZE = 64

# Per-architecture facts the kernel and the static checks need; nothing else should hard-code them.
# lds_bytes: LDS one workgroup may allocate. vgprs: unified VGPR+AGPR registers per lane of a wave.
# max_waves_per_eu: waves one SIMD can hold. fp8: the e4m3 flavour the MFMA reads (fnuz on CDNA3, OCP on
# CDNA4).
ARCHS: dict[str, dict[str, Any]] = {
    "gfx942": {"lds_bytes": 64 * 1024, "vgprs": 512, "max_waves_per_eu": 8, "fp8": "float8_e4m3fnuz"},
    "gfx950": {"lds_bytes": 160 * 1024, "vgprs": 512, "max_waves_per_eu": 8, "fp8": "float8_e4m3fn"},
}

ELEMENT_BITS = {"bfloat16": 16, "float16": 16, "float8_e4m3fnuz": 8, "float8_e4m3fn": 8}
OUT_DTYPES = ("bfloat16", "float16")

# (arch, operand bits, mfma size) -> MFMA (m, n, k). CDNA4 doubled K for 16-bit operands.
MFMA_SHAPES: dict[tuple[str, int, int], tuple[int, int, int]] = {
    ("gfx942", 16, 16): (16, 16, 16),
    ("gfx942", 16, 32): (32, 32, 8),
    ("gfx942", 8, 16): (16, 16, 32),
    ("gfx942", 8, 32): (32, 32, 16),
    ("gfx950", 16, 16): (16, 16, 32),
    ("gfx950", 16, 32): (32, 32, 16),
    ("gfx950", 8, 16): (16, 16, 32),
    ("gfx950", 8, 32): (32, 32, 16),
}


def operand_dtypes(arch: str) -> tuple[str, ...]:
    """Operand dtypes the kernel takes on `arch`: bf16, f16 and the arch's own fp8 e4m3 flavour."""
    return ("bfloat16", "float16", ARCHS[arch]["fp8"])


def _log2(value: int) -> int:
    return value.bit_length() - 1


@dataclasses.dataclass(frozen=True, slots=True)
class KernelPlan:
    """Everything static about one compiled kernel: problem shape, dtypes, tunables and target arch."""

    arch: str
    m: int
    k: int
    n: int
    g: int
    in_dtype: str
    out_dtype: str
    transpose_rhs: bool
    tile_m: int
    tile_n: int
    tile_k: int
    waves_m: int
    waves_n: int
    k_waves: int
    lds_stages: int
    waves_per_eu: int
    xcd_swizzle: int
    tile_order: str
    mfma: int
    lds_swizzle: bool

    @classmethod
    def of(cls, arch: str, problem: dict[str, Any], config: dict[str, Any]) -> KernelPlan:
        """From a Problem's and a Config's to_dict() (plain dicts: the worker has no moetune package)."""
        names = {f.name for f in dataclasses.fields(cls)} - {"arch", "in_dtype", "out_dtype"}
        values = {name: problem[name] if name in problem else config[name] for name in names}
        return cls(arch=arch, in_dtype=problem["lhs_dtype"], out_dtype=problem["out_dtype"], **values)

    # -- derived numbers ---------------------------------------------------------------------------

    @property
    def in_bits(self) -> int:
        return ELEMENT_BITS[self.in_dtype]

    @property
    def vec(self) -> int:
        """Operand elements in one 128-bit load."""
        return 128 // self.in_bits

    @property
    def mfma_shape(self) -> tuple[int, int, int]:
        return MFMA_SHAPES[(self.arch, self.in_bits, self.mfma)]

    @property
    def mfma_k_per_lane(self) -> int:
        """Contiguous K elements each lane holds for one MFMA (lanes split K into 4 or 2 groups)."""
        m, _, k = self.mfma_shape
        return k // (WAVE_SIZE // m)

    @property
    def threads_mn(self) -> int:
        return self.waves_m * self.waves_n * WAVE_SIZE

    @property
    def threads(self) -> int:
        return self.threads_mn * self.k_waves

    @property
    def n_tiles(self) -> int:
        return self.n // self.tile_n

    @property
    def k_tiles(self) -> int:
        return self.k // self.tile_k

    @property
    def m_slots(self) -> int:
        return -(-self.m // self.tile_m) + self.g

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.m_slots * self.n_tiles, 1, 1)

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.threads, 1, 1)

    @property
    def k_steps_per_wave(self) -> int:
        """MFMA K steps each K-wave group runs per K tile."""
        return self.tile_k // (self.mfma_shape[2] * self.k_waves)

    @property
    def stage_bytes(self) -> int:
        return (self.tile_m + self.tile_n) * self.tile_k * self.in_bits // 8

    @property
    def reduce_bytes(self) -> int:
        """float32 partial tiles the K-wave groups other than the first hand over through LDS."""
        return (self.k_waves - 1) * self.tile_m * self.tile_n * 4

    @property
    def lds_bytes(self) -> int:
        # The reduction buffer reuses the operand stages (a union): the main loop is over by then.
        return max(self.stage_bytes * self.lds_stages, self.reduce_bytes)

    @property
    def swizzle(self) -> tuple[int, int, int]:
        """LDS XOR swizzle (bits, base, shift): a row's 128-bit chunk index XOR the row index.

        tile_k=64 bf16: 8 chunks of 8 elements per row -> (3, 3, 3), the pattern FlyDSL's own GEMMs use.
        """
        base = _log2(self.vec)
        shift = _log2(self.tile_k) - base
        bits = min(shift, 3) if self.lds_swizzle else 0
        return bits, base, shift

    @property
    def kernel_name(self) -> str:
        return "moetune_flydsl_gmm_0"

    # -- rules ---------------------------------------------------------------------------------------

    def violations(self) -> list[str]:
        """Every reason this plan cannot be built (empty when it can); each names the values involved."""
        out: list[str] = []
        if self.arch not in ARCHS:
            return [f"arch={self.arch!r} is not one of {', '.join(ARCHS)}"]
        if self.in_dtype not in operand_dtypes(self.arch):
            return [
                f"operand dtype {self.in_dtype} is not one of "
                f"{', '.join(operand_dtypes(self.arch))} on {self.arch}"
            ]
        if self.out_dtype not in OUT_DTYPES:
            out.append(f"out_dtype={self.out_dtype} is not one of {', '.join(OUT_DTYPES)}")
        mm, mn, mk = self.mfma_shape
        if self.n % self.tile_n:
            out.append(f"N={self.n} is not a multiple of tile_n={self.tile_n}")
        if self.k % self.tile_k:
            out.append(f"K={self.k} is not a multiple of tile_k={self.tile_k}")
        if self.tile_m % (self.waves_m * mm):
            out.append(f"tile_m={self.tile_m} is not a multiple of waves_m*{mm}={self.waves_m * mm}")
        if self.tile_n % (self.waves_n * mn):
            out.append(f"tile_n={self.tile_n} is not a multiple of waves_n*{mn}={self.waves_n * mn}")
        if self.tile_k % (mk * self.k_waves):
            out.append(
                f"tile_k={self.tile_k} is not a multiple of k_waves*{mk}={mk * self.k_waves} (MFMA K={mk})"
            )
        if self.threads > 1024:
            out.append(f"{self.threads} threads per workgroup > 1024")
        out += self._copy_violations("A", self.tile_m, contiguous_k=True)
        out += self._copy_violations("B", self.tile_n, contiguous_k=self.transpose_rhs)
        if self.lds_bytes > ARCHS[self.arch]["lds_bytes"]:
            out.append(f"LDS {self.lds_bytes} bytes > {ARCHS[self.arch]['lds_bytes']} on {self.arch}")
        if self.waves_per_eu > ARCHS[self.arch]["max_waves_per_eu"]:
            out.append(
                f"waves_per_eu={self.waves_per_eu} > {ARCHS[self.arch]['max_waves_per_eu']} on {self.arch}"
            )
        # Buffer descriptors count bytes in 32 bits: lhs (from a tile's first row) and one expert's weights.
        for name, size in (("lhs", self.m * self.k), ("one expert's rhs", self.k * self.n)):
            if size * self.in_bits // 8 >= 2**32:
                out.append(
                    f"{name} spans {size * self.in_bits // 8} bytes >= 4 GiB (buffer descriptor limit)"
                )
        if self.m_slots * self.n_tiles >= 2**31:
            out.append(f"grid of {self.m_slots * self.n_tiles} workgroups overflows int32")
        return out

    def _copy_violations(self, operand: str, rows: int, *, contiguous_k: bool) -> list[str]:
        """The global->LDS copy spreads all threads over a (rows, tile_k) tile in 128-bit vectors."""
        along, across = (self.tile_k, rows) if contiguous_k else (rows, self.tile_k)
        if along % self.vec:
            return [
                f"{operand} tile's contiguous extent {along} is not a multiple of {self.vec} (128-bit loads)"
            ]
        lanes_along = along // self.vec
        if lanes_along > self.threads or self.threads % lanes_along:
            return [f"{operand} copy: {lanes_along} vectors per line do not divide {self.threads} threads"]
        lines_per_pass = self.threads // lanes_along
        if across % lines_per_pass:
            return [
                f"{operand} copy: {across} lines are not a multiple of {lines_per_pass} per pass of all "
                "threads"
            ]
        return []

    def flops(self) -> int:
        return 2 * self.m * self.k * self.n

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def occupancy_waves_per_simd(arch: str, vgprs: int, agprs: int, threads: int, lds_bytes: int) -> int:
    """Waves per SIMD the registers and LDS of a compiled kernel allow (CDNA: 4 SIMDs per CU).

    Registers: a wave owns vgprs+agprs of the 512 per lane, allocated in granules of 8.
    LDS: each workgroup takes lds_bytes of the CU's LDS; its waves spread over the 4 SIMDs.
    """
    info = ARCHS[arch]
    regs = max(8, math.ceil((vgprs + agprs) / 8) * 8)
    by_regs = info["vgprs"] // regs
    waves_per_group = max(1, threads // WAVE_SIZE)
    by_lds = info["max_waves_per_eu"]
    if lds_bytes:
        groups = info["lds_bytes"] // lds_bytes
        by_lds = max(0, groups * waves_per_group // 4)
    return max(0, min(by_regs, by_lds, info["max_waves_per_eu"]))
