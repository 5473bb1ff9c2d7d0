"""The xla backend's Config (JSON round-trip, own rules) and its Backend contract."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import pytest

from moetune.kernels import ops, registry
from moetune.kernels.backends.xla import BACKEND, XlaConfig
from moetune.kernels.backends.xla.config import STRATEGIES
from moetune.kernels.config import KernelConfig
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.problem import Problem

CPU = DeviceFingerprint("cpu", "cpu", 2, 0, "x86_64", "", "", "0.11.2", "0.11.2")
PROBLEM = Problem("grouped_matmul", m=64, k=32, n=16, g=4)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_json_round_trip(strategy):
    config = XlaConfig(strategy=strategy, chunk_m=64, items_per_step=3)
    assert XlaConfig.from_json(config.to_json()) == config
    assert XlaConfig.from_dict(config.to_dict()) == config
    assert hash(config) == hash(XlaConfig.from_json(config.to_json()))


def test_config_is_frozen_and_slotted():
    config = XlaConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.strategy = "segments"  # type: ignore[misc]
    assert not hasattr(config, "__dict__")
    assert issubclass(XlaConfig, KernelConfig)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"strategy": "magic"}, "strategy='magic' is not one of"),
        ({"chunk_m": 0}, "chunk_m=0 must be a positive integer"),
        ({"chunk_m": 12}, "chunk_m=12 is not a multiple of 8"),
        ({"items_per_step": -1}, "items_per_step=-1 must be a positive integer"),
        ({"chunk_m": True}, "chunk_m=True must be a positive integer"),
    ],
)
def test_config_rejects_broken_values(fields, message):
    with pytest.raises(ConfigInvalid, match=message):
        XlaConfig(**fields)


def test_from_dict_names_unknown_fields():
    with pytest.raises(ConfigInvalid, match="unknown XlaConfig fields: block_m"):
        XlaConfig.from_dict({"strategy": "chunked", "block_m": 64})


def test_registered_as_xla_everywhere_at_priority_zero():
    assert registry.get("xla") is BACKEND
    assert BACKEND.config_cls is XlaConfig
    assert BACKEND.priority == 0
    assert BACKEND.available(CPU) is None
    assert registry.default_backend(CPU).name == "xla"


def test_serves_every_registered_op():
    # It closes every fallback chain (kernels.api.LAST_RESORT_BACKEND), so no op may lack it.
    assert sorted(BACKEND.kernels) == ops.names()
    for op in ops.names():
        assert callable(BACKEND.kernel_for(op))


def test_build_needs_an_xla_config():
    class OtherConfig(KernelConfig):
        pass

    with pytest.raises(ConfigInvalid, match="xla needs an XlaConfig"):
        BACKEND.build(PROBLEM, OtherConfig())


def test_source_hash_covers_the_backend_folder_only():
    import moetune.kernels.backend as base

    digest = BACKEND.source_hash()
    assert len(digest) == 16
    assert digest != base._package_hash("moetune.kernels")
    assert digest == base._package_hash("moetune.kernels.backends.xla")


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_float32_multiplies_at_full_precision(strategy, dtype):
    # XLA's GPU default would round float32 operands to TF32 (kernel.py); the jaxpr shows what was asked.
    problem = Problem("grouped_matmul", m=9, k=8, n=8, g=2, lhs_dtype=dtype, rhs_dtype=dtype, out_dtype=dtype)
    operands = (jnp.ones((9, 8), dtype), jnp.ones((2, 8, 8), dtype), jnp.ones((2,), jnp.int32))
    text = str(jax.make_jaxpr(BACKEND.build(problem, XlaConfig(strategy=strategy)))(*operands))
    dots = re.findall(r"\bdot_general\[|ragged_dot_general\[", text)
    highest = re.findall(r"precision=\(Precision.HIGHEST, Precision.HIGHEST\)", text)
    assert dots, text
    assert len(highest) == (len(dots) if dtype == "float32" else 0), text
