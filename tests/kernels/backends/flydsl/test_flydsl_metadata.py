"""Reading static metrics from AMDGPU code-object notes, and the static checks that prune candidates."""

from __future__ import annotations

import pytest
from code_objects import code_object, kernel

from moetune.kernels.backends.flydsl import metadata
from moetune.kernels.backends.flydsl.plan import ARCHS


def test_metrics_come_from_the_note():
    m = metadata.kernel_metrics(code_object(kernel()), "moetune_flydsl_gmm_0")
    assert (m.arch, m.vgpr_count, m.lds_bytes, m.kernarg_bytes) == ("gfx942", 128, 32768, 32)
    assert [a.value_kind for a in m.args] == ["global_buffer"] * 4
    assert m.to_dict()["args"][3] == {"offset": 24, "size": 8, "value_kind": "global_buffer"}


def test_identical_binaries_hash_alike_and_different_ones_do_not():
    a, b = code_object(kernel()), code_object(kernel(**{".vgpr_count": 96}))
    assert metadata.binary_hash(a) == metadata.binary_hash(bytes(a)) != metadata.binary_hash(b)


@pytest.mark.parametrize(
    ("overrides", "threads", "waves_per_eu", "reason"),
    [
        ({".vgpr_spill_count": 3}, 256, 0, "spills: 3 VGPRs"),
        ({".private_segment_fixed_size": 16}, 256, 0, "scratch"),
        ({".group_segment_fixed_size": ARCHS["gfx942"]["lds_bytes"] + 1}, 256, 0, "LDS 65537 bytes > 65536"),
        ({".max_flat_workgroup_size": 256}, 512, 0, "512 threads"),
        ({".vgpr_count": 256}, 256, 4, "waves_per_eu=4 requested but registers and LDS allow 2"),
    ],
)
def test_static_check_prunes_with_the_reason(overrides, threads, waves_per_eu, reason):
    m = metadata.kernel_metrics(code_object(kernel(**overrides)))
    assert reason in metadata.static_check(m, threads=threads, waves_per_eu=waves_per_eu)


def test_a_clean_kernel_passes_the_static_check():
    m = metadata.kernel_metrics(code_object(kernel()))
    assert metadata.static_check(m, threads=256, waves_per_eu=2) is None


def test_gfx950_has_more_lds_than_gfx942():
    lds = ARCHS["gfx942"]["lds_bytes"] * 2
    on_942 = metadata.kernel_metrics(code_object(kernel(**{".group_segment_fixed_size": lds})))
    on_950 = metadata.kernel_metrics(
        code_object(kernel(**{".group_segment_fixed_size": lds}), target="amdgcn-amd-amdhsa--gfx950")
    )
    assert metadata.static_check(on_942, threads=256) is not None
    assert metadata.static_check(on_950, threads=256) is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not an elf at all", "not a little-endian ELF64"),
        (code_object(kernel(), machine=62), "is not AMDGPU"),
    ],
)
def test_bad_code_objects_are_rejected(data, message):
    with pytest.raises(metadata.CodeObjectInvalid, match=message):
        metadata.kernel_metrics(data)


def test_asking_for_a_missing_kernel_names_the_ones_present():
    with pytest.raises(metadata.CodeObjectInvalid, match="moetune_flydsl_gmm_0"):
        metadata.kernel_metrics(code_object(kernel()), "other")
