"""The flydsl backend's timer inside the tuner's worker: each timing in a child process with a fake HIP.

The child is the real `python -m moetune.kernels.backends.flydsl.hip_runtime`; only hip-python is replaced
(fake_hip_site/hip), so what a correct, a wrong and a crashing code object become is each a real
trial status from CandidateRunner.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from fake_hip import TIMING_CONFIG

from moetune.kernels import registry
from moetune.kernels.backends.flydsl.compile import plan_for
from moetune.kernels.backends.flydsl.config import FlyDSLConfig
from moetune.kernels.backends.flydsl.timer import CodeObjectKernel, HipEventTimer
from moetune.kernels.errors import Unsupported
from moetune.kernels.problem import Problem
from moetune.tuner.candidate import CandidateRunner, Prepared
from moetune.tuner.tasks import CandidateTask, now

HERE = Path(__file__).resolve().parent
PROBLEM = Problem(
    "grouped_matmul", m=48, k=64, n=128, g=3, lhs_dtype="bfloat16", rhs_dtype="bfloat16", out_dtype="bfloat16"
)
PLAN = plan_for(PROBLEM, FlyDSLConfig.from_dict(TIMING_CONFIG), "gfx942")


@jax.jit
def reference(lhs, rhs, group_sizes):
    """Stands in for the JAX launch of the code object: the tuner verifies through it."""
    return jax.lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=jnp.float32).astype(jnp.bfloat16)


@pytest.fixture
def kernel(tmp_path, monkeypatch) -> CodeObjectKernel:
    """A compiled candidate whose code object the fake HIP of the timing child loads."""
    hsaco = tmp_path / "kernel.hsaco"
    hsaco.write_bytes(PLAN.kernel_name.encode())  # the fake's code object is the kernel's name
    path = [str(HERE / "fake_hip_site"), str(HERE), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, path)))
    return CodeObjectKernel(reference, PLAN, str(hsaco), PLAN.kernel_name)


def fake_hip(monkeypatch, mode: str) -> None:
    monkeypatch.setenv("MOETUNE_FAKE_HIP", json.dumps({"plan": PLAN.to_dict(), "mode": mode}))


def run_candidate(kernel: CodeObjectKernel):
    task = CandidateTask("t", "flydsl", PROBLEM, TIMING_CONFIG, ((20, 0, 17),), ((16, 16, 16),), runs=5)
    return CandidateRunner("w").run(Prepared(task, [kernel], [""], 0.1, now()))


def test_the_backend_times_its_code_objects_with_hip_events():
    assert isinstance(registry.get("flydsl").timer(), HipEventTimer)
    assert (registry.get("flydsl").device_resource, registry.get("flydsl").visible_devices_env) == (
        "amd_gpu",
        "HIP_VISIBLE_DEVICES",
    )


def test_a_correct_code_object_is_verified_and_timed_in_its_own_process(kernel, monkeypatch):
    fake_hip(monkeypatch, "ok")
    result = run_candidate(kernel)
    assert (result.status, result.error) == ("ok", "")
    assert result.samples_s == (0.002,) * 5  # the fake's HIP events: 2 ms per launch
    assert result.verify_error is not None


def test_a_wrong_result_in_the_timing_process_is_a_wrong_result_trial(kernel, monkeypatch):
    fake_hip(monkeypatch, "corrupt")
    result = run_candidate(kernel)
    assert result.status == "wrong_result" and "relative error" in result.error


def test_a_timing_process_that_aborts_is_a_crashed_trial_and_the_worker_lives_on(kernel, monkeypatch):
    fake_hip(monkeypatch, "abort")
    result = run_candidate(kernel)
    assert result.status == "crashed" and "CandidateCrashed" in result.error
    fake_hip(monkeypatch, "ok")
    assert run_candidate(kernel).status == "ok"


def test_the_timer_refuses_anything_but_a_code_object_kernel():
    with pytest.raises(Unsupported, match="FlyDSL code objects"):
        HipEventTimer().time(reference, [(None, None, [1, 2, 3])])
