"""Static facts of a compiled AMDGPU code object (HSACO), read from its ELF note, and the static checks.

An HSACO is an ELF shared object whose PT_NOTE / SHT_NOTE holds an "AMDGPU" note of type
NT_AMDGPU_METADATA (32): a msgpack map with "amdhsa.kernels", one entry per kernel, carrying
.vgpr_count, .agpr_count, .sgpr_count, .vgpr_spill_count, .sgpr_spill_count,
.group_segment_fixed_size (static LDS bytes), .private_segment_fixed_size (scratch bytes per lane),
.kernarg_segment_size, .max_flat_workgroup_size, .wavefront_size and .args. This module parses that
note itself (stdlib + msgpack), so no LLVM tool is needed to prune candidates.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from typing import Any

from moetune.kernels.backends.flydsl.plan import ARCHS, occupancy_waves_per_simd
from moetune.kernels.errors import ConfigInvalid

NT_AMDGPU_METADATA = 32
_ELF_MAGIC = b"\x7fELF"
_EM_AMDGPU = 224
_SHT_NOTE = 7


class CodeObjectInvalid(ConfigInvalid):
    """The bytes are not an AMDGPU code object with readable kernel metadata."""


@dataclasses.dataclass(frozen=True, slots=True)
class KernelArg:
    offset: int
    size: int
    value_kind: str


@dataclasses.dataclass(frozen=True, slots=True)
class KernelMetrics:
    """Static resource use of one kernel, as the code object's metadata states it."""

    name: str
    target: str  # e.g. "amdgcn-amd-amdhsa--gfx942"
    vgpr_count: int
    agpr_count: int
    sgpr_count: int
    vgpr_spill_count: int
    sgpr_spill_count: int
    lds_bytes: int  # .group_segment_fixed_size: static LDS
    scratch_bytes: int  # .private_segment_fixed_size: per-lane scratch, non-zero when something spilled
    kernarg_bytes: int
    max_workgroup_size: int
    wavefront_size: int
    args: tuple[KernelArg, ...] = ()

    @property
    def arch(self) -> str:
        return self.target.rsplit("-", 1)[-1].split(":", 1)[0]

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["args"] = [dataclasses.asdict(a) for a in self.args]
        return data


def binary_hash(code_object: bytes) -> str:
    """Identity of a binary: candidates whose code objects hash alike are one kernel, timed once."""
    return hashlib.sha256(code_object).hexdigest()


def _notes(elf: bytes):
    """(owner, type, descriptor) of every note in every SHT_NOTE section of a little-endian ELF64."""
    if elf[:4] != _ELF_MAGIC or elf[4] != 2 or elf[5] != 1:
        raise CodeObjectInvalid("not a little-endian ELF64 file")
    (machine,) = struct.unpack_from("<H", elf, 18)
    if machine != _EM_AMDGPU:
        raise CodeObjectInvalid(f"ELF machine {machine} is not AMDGPU ({_EM_AMDGPU})")
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
    for i in range(shnum):
        base = shoff + i * shentsize
        if base + 64 > len(elf):
            raise CodeObjectInvalid("section header past end of file")
        _, sh_type, _, _, offset, size = struct.unpack_from("<IIQQQQ", elf, base)
        if sh_type != _SHT_NOTE:
            continue
        pos, end = offset, offset + size
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", elf, pos)
            pos += 12
            owner = elf[pos : pos + namesz].rstrip(b"\0").decode(errors="replace")
            pos += (namesz + 3) & ~3
            desc = elf[pos : pos + descsz]
            pos += (descsz + 3) & ~3
            yield owner, ntype, desc


def read_metadata(code_object: bytes) -> dict[str, Any]:
    """The decoded NT_AMDGPU_METADATA map of `code_object`."""
    import msgpack

    for owner, ntype, desc in _notes(code_object):
        if owner == "AMDGPU" and ntype == NT_AMDGPU_METADATA:
            try:
                return msgpack.unpackb(desc, raw=False, strict_map_key=False)
            except (ValueError, msgpack.exceptions.ExtraData) as e:
                raise CodeObjectInvalid(f"AMDGPU metadata note is not msgpack ({e})") from e
    raise CodeObjectInvalid("no NT_AMDGPU_METADATA note (code object v3+ expected)")


def kernel_metrics(code_object: bytes, kernel_name: str | None = None) -> KernelMetrics:
    """Metrics of `kernel_name` (or of the only kernel) in `code_object`."""
    meta = read_metadata(code_object)
    kernels = meta.get("amdhsa.kernels") or []
    if kernel_name is not None:
        kernels = [k for k in kernels if k.get(".name") == kernel_name]
    if len(kernels) != 1:
        names = [k.get(".name") for k in meta.get("amdhsa.kernels") or []]
        raise CodeObjectInvalid(f"expected one kernel named {kernel_name!r}; the code object has {names}")
    k = kernels[0]
    return KernelMetrics(
        name=k[".name"],
        target=str(meta.get("amdhsa.target", "")),
        vgpr_count=int(k.get(".vgpr_count", 0)),
        agpr_count=int(k.get(".agpr_count", 0)),
        sgpr_count=int(k.get(".sgpr_count", 0)),
        vgpr_spill_count=int(k.get(".vgpr_spill_count", 0)),
        sgpr_spill_count=int(k.get(".sgpr_spill_count", 0)),
        lds_bytes=int(k.get(".group_segment_fixed_size", 0)),
        scratch_bytes=int(k.get(".private_segment_fixed_size", 0)),
        kernarg_bytes=int(k.get(".kernarg_segment_size", 0)),
        max_workgroup_size=int(k.get(".max_flat_workgroup_size", 0)),
        wavefront_size=int(k.get(".wavefront_size", 64)),
        args=tuple(
            KernelArg(int(a.get(".offset", 0)), int(a.get(".size", 0)), str(a.get(".value_kind", "")))
            for a in k.get(".args", [])
        ),
    )


def static_check(metrics: KernelMetrics, *, threads: int, waves_per_eu: int = 0) -> str | None:
    """Why a compiled candidate is pruned without timing (None when it may be timed).

    Spills go to scratch memory and are slower than any config that fits; LDS past the arch's limit
    cannot launch; a waves_per_eu request the registers cannot meet means the hint bought nothing.
    """
    arch = metrics.arch
    if arch not in ARCHS:
        return f"code object targets {metrics.target!r}, not one of {', '.join(ARCHS)}"
    if metrics.vgpr_spill_count or metrics.sgpr_spill_count:
        return f"spills: {metrics.vgpr_spill_count} VGPRs and {metrics.sgpr_spill_count} SGPRs to scratch"
    if metrics.scratch_bytes:
        return f"uses {metrics.scratch_bytes} bytes of scratch per lane (private segment)"
    limit = ARCHS[arch]["lds_bytes"]
    if metrics.lds_bytes > limit:
        return f"LDS {metrics.lds_bytes} bytes > {limit} on {arch}"
    if metrics.max_workgroup_size and threads > metrics.max_workgroup_size:
        return f"{threads} threads > the kernel's max_flat_workgroup_size {metrics.max_workgroup_size}"
    occupancy = occupancy_waves_per_simd(
        arch, metrics.vgpr_count, metrics.agpr_count, threads, metrics.lds_bytes
    )
    if occupancy == 0:
        return (
            f"cannot be resident: {metrics.vgpr_count}+{metrics.agpr_count} registers, "
            f"{metrics.lds_bytes} bytes LDS"
        )
    if waves_per_eu and occupancy < waves_per_eu:
        return f"waves_per_eu={waves_per_eu} requested but registers and LDS allow {occupancy}"
    return None
