"""The model's kernel choices: one frozen value, checked at construction, resolved per backend; and the
"auto"/"kernel"/"xla"/"interpret" resolution in moetune.kernels.moe.pallas_mode that every choice uses."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.moe import pallas_mode
from moetune_lab.model import mixtral
from moetune_lab.model.config import model_config
from moetune_lab.model.decode_attention import Tiling
from moetune_lab.model.kernel_choices import DEFAULT_CHOICES, MODE_FIELDS, KernelChoices
from moetune_lab.model.weights import init_params

ON_GPU = jax.default_backend() == "gpu"


def test_auto_resolves_by_backend_and_the_rest_stay_as_given():
    assert pallas_mode.resolve("auto") == ("kernel" if ON_GPU else "xla")
    for mode in ("kernel", "xla", "interpret"):
        assert pallas_mode.resolve(mode) == mode
    with pytest.raises(ConfigInvalid, match="gemv='fast'; expected one of auto, kernel, xla, interpret"):
        pallas_mode.resolve("fast", "gemv")


def test_defaults_are_auto_and_the_float32_residual():
    assert all(getattr(DEFAULT_CHOICES, name) == "auto" for name in MODE_FIELDS)
    assert (
        DEFAULT_CHOICES.decode_attention_tiling == Tiling()
        and DEFAULT_CHOICES.decode_residual == "accumulate"
    )
    resolved = DEFAULT_CHOICES.resolved()
    assert {resolved[name] for name in MODE_FIELDS} == {"kernel" if ON_GPU else "xla"}
    assert resolved["decode_attention_tiling"] == "block_k=64,splits=32,num_warps=4,num_stages=2"


def test_decode_block_is_moe_mlps_decode_mode_passed_as_given():
    """Its "auto" is moe_mlp's (which decides per shape), not resolved here to "the kernel on a GPU"."""
    assert DEFAULT_CHOICES.decode_block == "auto" and DEFAULT_CHOICES.resolved()["decode_block"] == "auto"
    for mode in pallas_mode.MODES:
        assert KernelChoices.parse(decode_block=mode).resolved()["decode_block"] == mode
    with pytest.raises(ConfigInvalid, match="decode_block='on'; expected one of auto, kernel, xla"):
        KernelChoices(decode_block="on")
    with pytest.raises(ValueError, match="decode_block is not one of the modes resolved here"):
        DEFAULT_CHOICES.mode("decode_block")


def test_choices_are_hashable_values_checked_when_built():
    a, b = KernelChoices(gemv="xla"), KernelChoices(gemv="xla")
    assert a == b and hash(a) == hash(b) and a != DEFAULT_CHOICES
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.gemv = "kernel"  # type: ignore[misc]
    for field in MODE_FIELDS:
        with pytest.raises(ConfigInvalid, match=f"{field}='on'; expected one of"):
            KernelChoices(**{field: "on"})
    with pytest.raises(ConfigInvalid, match="decode_residual='both'; expected one of accumulate, add"):
        KernelChoices(decode_residual="both")
    with pytest.raises(ConfigInvalid, match="decode_attention_tiling='block_k=64' is not a Tiling"):
        KernelChoices(decode_attention_tiling="block_k=64")  # type: ignore[arg-type]


def test_parse_takes_flag_text():
    choices = KernelChoices.parse(
        routing="interpret", decode_attention_tiling="splits=64", decode_residual="add"
    )
    assert choices == KernelChoices(
        routing="interpret", decode_attention_tiling=Tiling(splits=64), decode_residual="add"
    )
    assert choices.resolved()["routing"] == "interpret"
    with pytest.raises(ConfigInvalid, match="unknown kernel choices attention; known: routing, norm_router"):
        KernelChoices.parse(attention="xla")
    with pytest.raises(ConfigInvalid, match="decode attention tiling: splits=6 must be a power of two"):
        KernelChoices.parse(decode_attention_tiling="splits=6")


def test_the_model_reads_no_environment_variable_for_its_kernels(monkeypatch):
    """The variables that once chose the kernels are ignored: set to values the old code refused, the
    model still traces, and the choice given as an argument decides."""
    for name in (
        "ROUTING",
        "GEMV",
        "NORM_ROUTER",
        "NORM_ROUTE_GATHER",
        "DECODE_ATTENTION",
        "DECODE_RESIDUAL",
    ):
        monkeypatch.setenv(f"MOETUNE_{name}", "bogus")
    monkeypatch.setenv("MOETUNE_DECODE_ATTENTION_TILING", "splits=3")
    jax.clear_caches()
    config = model_config("tiny")
    params = init_params(config, seed=0)
    cache = mixtral.KVCache.empty(config, 1, 4)
    tokens = jnp.zeros((1,), jnp.int32)
    for choices in (DEFAULT_CHOICES, KernelChoices(decode_attention="xla", gemv="xla")):
        lowered = mixtral.decode_step.lower(
            params, tokens, cache, 1, config=config, moe_path="moetune", choices=choices
        )
        assert "moe_mlp" in lowered.as_text()
