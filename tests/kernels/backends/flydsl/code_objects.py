"""Synthetic AMDGPU code objects: a minimal ELF64 with an NT_AMDGPU_METADATA note (msgpack)."""

from __future__ import annotations

import struct

import msgpack


def code_object(kernel: dict, *, target="amdgcn-amd-amdhsa--gfx942", machine=224) -> bytes:
    """A minimal ELF64 with one SHT_NOTE section holding an NT_AMDGPU_METADATA note."""
    desc = msgpack.packb({"amdhsa.version": [1, 2], "amdhsa.target": target, "amdhsa.kernels": [kernel]})
    name = b"AMDGPU\0"
    note = (
        struct.pack("<III", len(name), len(desc), 32)
        + name.ljust(8, b"\0")
        + desc.ljust(-(-len(desc) // 4) * 4, b"\0")
    )
    note_offset = 64
    shoff = note_offset + len(note)
    header = bytearray(64)
    header[:16] = b"\x7fELF\x02\x01\x01\x40\x04" + bytes(7)
    struct.pack_into("<HHIQQQIHHHHHH", header, 16, 3, machine, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 2, 0)
    null_section = bytes(64)
    note_section = struct.pack("<IIQQQQIIQQ", 0, 7, 0, 0, note_offset, len(note), 0, 0, 4, 0)
    return bytes(header) + note + null_section + note_section


def kernel(**overrides) -> dict:
    k = {
        ".name": "moetune_flydsl_gmm_0",
        ".vgpr_count": 128,
        ".agpr_count": 0,
        ".sgpr_count": 56,
        ".vgpr_spill_count": 0,
        ".sgpr_spill_count": 0,
        ".group_segment_fixed_size": 32768,
        ".private_segment_fixed_size": 0,
        ".kernarg_segment_size": 32,
        ".max_flat_workgroup_size": 256,
        ".wavefront_size": 64,
        ".args": [{".offset": 8 * i, ".size": 8, ".value_kind": "global_buffer"} for i in range(4)],
    }
    k.update(overrides)
    return k
