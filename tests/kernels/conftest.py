"""Isolation for dispatch tests (no user database, no backend override, a fresh winner lookup each test)
and probe backends that decline on demand."""

from __future__ import annotations

import dataclasses
import sys
import types

import jax
import pytest

from moetune.kernels import registry
from moetune.kernels.backend import Backend
from moetune.kernels.config import KernelConfig
from moetune.kernels.errors import ConfigInvalid, Unsupported
from moetune.kernels.lookup import LOOKUP
from moetune.kernels.problem import Problem


@pytest.fixture(autouse=True)
def isolated_lookup(monkeypatch, tmp_path):
    monkeypatch.delenv("MOETUNE_DB", raising=False)
    monkeypatch.delenv("MOETUNE_BACKEND", raising=False)
    # The default database path lives under the XDG data folder: point it at an empty one.
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    LOOKUP.clear()
    yield LOOKUP
    LOOKUP.clear()


@dataclasses.dataclass(frozen=True, slots=True)
class ProbeConfig(KernelConfig):
    block: int = 8


class ProbeBackend(Backend):
    """A registrable backend that computes with ragged_dot and declines wherever a test tells it to."""

    config_cls = ProbeConfig
    kernels = {"grouped_matmul": "ragged_dot"}  # made in build()

    def __init__(self, name, *, priority=0, unavailable=None, check_reason=None, build_reason=None):
        self.name = name
        self.priority = priority
        self.unavailable = unavailable
        self.check_reason = check_reason
        self.build_reason = build_reason
        self.built: list[tuple[Problem, ProbeConfig]] = []

    def available(self, device):
        return self.unavailable

    def check_problem(self, problem):
        if self.check_reason:
            raise Unsupported(self.check_reason)

    def search_space(self, problem, device):
        raise NotImplementedError("probe backends are not tuned")

    def heuristic(self, problem, device):
        return ProbeConfig()

    def build(self, problem, config):
        if self.build_reason:
            raise Unsupported(self.build_reason)
        if config.block == 13:
            raise ConfigInvalid("block=13 is unlucky")
        self.built.append((problem, config))
        # The backend contract: lhs may carry rows past m, which belong to no group.
        return lambda lhs, rhs, sizes: jax.lax.ragged_dot(lhs[: problem.m], rhs, sizes)

    def source_hash(self):
        return "probe"


@pytest.fixture
def probe_backends(monkeypatch):
    """register(name, **options) -> a ProbeBackend registered under `name` for this test."""
    names = []

    def register(name, **options):
        module = types.ModuleType(f"moetune_test_probe_{name}")
        module.BACKEND = ProbeBackend(name, **options)
        monkeypatch.setitem(sys.modules, module.__name__, module)
        registry.register(name, module.__name__)
        names.append(name)
        return module.BACKEND

    yield register
    for name in names:
        registry.unregister(name)
