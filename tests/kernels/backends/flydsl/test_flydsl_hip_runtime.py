"""The hip-python timing path against a fake HIP runtime (no AMD GPU exists on these machines)."""

from __future__ import annotations

import json

import pytest
from fake_hip import TIMING_CONFIG, FakeHip, grouped_matmul_kernel

from moetune.kernels.backends.flydsl.hip_runtime import (
    CandidateCrashed,
    HipError,
    HipRuntime,
    time_code_object,
    time_in_subprocess,
    timing_request,
)
from moetune.kernels.backends.flydsl.plan import KernelPlan
from moetune.kernels.errors import WrongResult


def plan(transpose_rhs=False):
    problem = dict(
        m=48, k=64, n=128, g=3, lhs_dtype="bfloat16", out_dtype="bfloat16", transpose_rhs=transpose_rhs
    )
    return KernelPlan.of("gfx942", problem, TIMING_CONFIG)


@pytest.mark.parametrize("transpose_rhs", [False, True])
def test_times_a_correct_kernel_and_passes_the_pointers_in_order(transpose_rhs):
    p = plan(transpose_rhs)
    hip = FakeHip({p.kernel_name: grouped_matmul_kernel(p)}, ms=2.0)
    result = time_code_object(HipRuntime(hip), p.kernel_name.encode(), p.kernel_name, p, [20, 0, 17], runs=5)
    assert result.samples_s == (0.002,) * 5
    assert result.max_rel_error < 1e-2
    name, grid, block, shared, pointers = hip.launches[-1]
    assert (name, grid, block, shared) == (p.kernel_name, p.grid, p.block, 0)
    assert len(pointers) == 4 and len(set(pointers)) == 4
    assert hip.freed > 0 and not hip.memory  # every buffer it allocated was freed


def test_fingerprint_names_arch_cu_count_and_pci_id():
    hip = FakeHip({}, arch="gfx950:sramecc+:xnack-", cu_count=256, pci_device_id=0x75A0)
    fp = HipRuntime(hip).fingerprint()
    assert (fp["arch"], fp["cu_count"], fp["pci_device_id"]) == ("gfx950", 256, 0x75A0)


def test_wrong_output_is_a_wrong_result():
    p = plan()
    hip = FakeHip({p.kernel_name: grouped_matmul_kernel(p, corrupt=True)})
    with pytest.raises(WrongResult, match="relative error"):
        time_code_object(HipRuntime(hip), p.kernel_name.encode(), p.kernel_name, p, [20, 10, 18])


def test_a_code_object_that_does_not_load_is_a_hip_error():
    p = plan()
    hip = FakeHip({})
    with pytest.raises(HipError, match="hipModuleLoadData failed"):
        time_code_object(HipRuntime(hip), b"garbage", p.kernel_name, p, [16, 16, 16])


def test_group_count_must_match():
    p = plan()
    with pytest.raises(ValueError, match="2 group sizes for G=3"):
        time_code_object(HipRuntime(FakeHip({})), b"", p.kernel_name, p, [1, 2])


def test_a_dying_timing_process_is_reported_as_crashed(tmp_path):
    # This interpreter has no hip-python: the child dies importing it, as a failed HIP load would kill it.
    request = timing_request(plan(), str(tmp_path / "x.hsaco"), "k", [16, 16, 16], runs=10)
    assert KernelPlan(**json.loads(json.dumps(request))["plan"]) == plan()
    with pytest.raises(CandidateCrashed, match="exited with"):
        time_in_subprocess(request, timeout_s=120)
