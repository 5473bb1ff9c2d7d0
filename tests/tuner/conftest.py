"""Fixtures of the tuner tests: simulated and fault-injecting backends, and one real Ray cluster shared by
the whole session (starting Ray costs seconds on a small machine). The store per test and the guard of
the user's database are in tests/conftest.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from moetune.kernels import registry
from moetune.tuner import local_cluster

# Ray reads the settings that keep moetune's local cluster on loopback and behind its token once, when it
# is imported (tuner/local_cluster.py), and a test may import Ray before the cluster starts (`moetune
# doctor` does): so they are set before any test runs, as a user would set them before importing Ray.
os.environ.setdefault(local_cluster.LOOPBACK_ENV, "0")
os.environ.setdefault(local_cluster.AUTH_MODE_ENV, "token")

# The helper backends are imported by their full name (tests.tuner.faulty_backend): here through pytest's
# `pythonpath` option (pyproject.toml), in Ray workers through PYTHONPATH (the ray_cluster fixture).
REPO = Path(__file__).resolve().parents[2]


def _register(name: str, module: str):
    registry.register(name, module)
    try:
        yield registry.get(name)
    finally:
        registry.unregister(name)


@pytest.fixture
def sim():
    """The simulated backend "sim" (tests/tuner/sim_backend.py) with an empty cost table."""
    from tests.tuner import sim_backend

    sim_backend.COSTS.clear()
    yield from _register("sim", "tests.tuner.sim_backend")
    sim_backend.COSTS.clear()


@pytest.fixture
def faulty():
    """The fault-injecting backend "faulty" (tests/tuner/faulty_backend.py), importable by Ray workers."""
    yield from _register("faulty", "tests.tuner.faulty_backend")


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster with 2 CPUs for the whole session; workers can import `tests`."""
    from moetune.tuner import ray_pool

    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), previous]))
    started = ray_pool.connect(num_cpus=2)
    import ray

    yield ray.get_runtime_context().gcs_address
    if started:
        ray_pool.disconnect()
    if previous is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = previous


@pytest.fixture
def two_kernel():
    """The simulated two-kernel backend "two_kernel" (tests/tuner/two_kernel_backend.py)."""
    from tests.tuner import two_kernel_backend

    two_kernel_backend.FORBIDDEN.clear()
    yield from _register("two_kernel", "tests.tuner.two_kernel_backend")
    two_kernel_backend.FORBIDDEN.clear()
