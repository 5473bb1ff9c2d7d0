"""The limits sweep_setup puts on a sweep before anything is written or started."""

from __future__ import annotations

import pytest

from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.problem import Problem
from moetune.tuner import ray_pool, sweep_setup
from moetune.tuner.plan import PlannedProblem
from moetune.tuner.spec import SweepSpec


def device(memory_bytes: int) -> DeviceFingerprint:
    return DeviceFingerprint("GPU X", "gpu", 10, memory_bytes, "9.0", "1", "1", "0.1", "0.1")


def planned(**shape: int) -> list[PlannedProblem]:
    problem = Problem("grouped_matmul", **shape)
    return [PlannedProblem(problem, f"m={problem.m}")]


def test_operands_past_the_device_memory_are_refused_once_the_device_is_known():
    small = planned(m=4096, k=4096, n=4096, g=8)  # 256 MiB of weights, 64 MiB of activations
    sweep_setup.check_fits(small)
    sweep_setup.check_fits(small, device(1 << 30))
    sweep_setup.check_fits(small, device(0))  # a compile-only stand-in knows no memory
    with pytest.raises(ConfigInvalid, match=r"past the memory of GPU X, 0\.2 GiB"):
        sweep_setup.check_fits(small, device(200 << 20))


def test_the_fixed_caps_name_their_limit():
    with pytest.raises(ConfigInvalid, match="g=65537 experts is past the limit of 65536"):
        sweep_setup.check_fits(planned(m=8, k=64, n=64, g=65537))
    with pytest.raises(ConfigInvalid, match=r"past the limit of 1,024\.0 GiB"):
        sweep_setup.check_fits(planned(m=2**31 - 1, k=256, n=64, g=1))


def test_workers_above_a_joined_clusters_cpus_are_refused_before_any_worker(monkeypatch):
    joined = []
    monkeypatch.setattr(ray_pool, "connect", lambda address: joined.append(address) or False)
    monkeypatch.setattr(ray_pool, "cluster_cpus", lambda: 16)
    monkeypatch.setattr(ray_pool, "RayExecutor", lambda **kw: pytest.fail("a worker was started"))
    spec = SweepSpec().override(workers=17, ray_address="10.0.0.1:6379")
    with pytest.raises(ConfigInvalid, match="--workers 17 is more than the 16 CPUs of the Ray cluster at 10"):
        sweep_setup.make_executor(spec)
    assert joined == ["10.0.0.1:6379"]
