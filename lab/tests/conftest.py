"""Fixtures of the lab's tests: no test touches the user's database, a SQLite store per test, the
Pallas Triton lowering answered as an H200 would on a CPU, and the tiny model decoding alike across
kernel choices."""

from __future__ import annotations

import dataclasses
import os

import pytest

# The kernels under test run interpreted on XLA:CPU over tiny arrays: compiling them costs far more than
# running them, and LLVM's optimisation passes are most of that compile. Set before any backend starts,
# and inherited by the subprocesses and Ray workers the tests start. Not on a GPU host, whose XLA code
# the GPU tests leave as a user gets it.
_FAST_COMPILE = "--xla_backend_optimization_level=0"
if not os.path.exists("/dev/nvidia0") and _FAST_COMPILE not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FAST_COMPILE}".strip()


@pytest.fixture(autouse=True)
def no_default_database(monkeypatch, tmp_path):
    """No test may touch the user's real database through $MOETUNE_DB or the default path."""
    monkeypatch.delenv("MOETUNE_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))


@pytest.fixture
def db_url(tmp_path):
    return f"sqlite:///{tmp_path / 'moetune.db'}"


@pytest.fixture
def store(db_url):
    from moetune.db import open_store

    with open_store(db_url) as s:
        yield s


@pytest.fixture
def triton_lowering_for_h200():
    """Pallas's Triton lowering asks the local GPU for its compute capability; on a CPU, answer as an H200
    would. Lowering to Triton IR happens in Python; only compiling that IR needs the GPU."""
    import unittest.mock

    from jax._src.pallas.triton import gpu_info
    from jax.experimental.pallas import triton as pltriton

    h200 = lambda: gpu_info.get_gpu_info_from_version(pltriton.GpuVersion.H200)  # noqa: E731
    with unittest.mock.patch.object(gpu_info, "get_gpu_info", h200):
        yield


@pytest.fixture
def assert_decode_same_across_modes():
    """check(field, values, base=DEFAULT_CHOICES): the float32 tiny model decodes alike with KernelChoices
    field `field` at each of two values (a Pallas kernel's "kernel"/"interpret" against "xla"): a 6-token
    prompt, one decode_step at position 6, then decode_loop's 3 steps from 7. jax's caches are cleared
    around each run, so that what a test patches (a tiling table) is read by a fresh trace; float32
    matmuls, so that XLA's dots do not round through TF32 on a GPU."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from moetune_lab.model import mixtral
    from moetune_lab.model.config import model_config
    from moetune_lab.model.kernel_choices import DEFAULT_CHOICES, KernelChoices
    from moetune_lab.model.weights import init_params

    config = dataclasses.replace(model_config("tiny"), dtype="float32")
    params = init_params(config, seed=0)
    prompt = jax.random.randint(jax.random.key(1), (2, 6), 0, config.vocab, dtype=jnp.int32)

    def decode(choices: KernelChoices):
        static = {"config": config, "moe_path": "moetune", "choices": choices}
        jax.clear_caches()
        try:
            with jax.default_matmul_precision("float32"):
                cache = mixtral.KVCache.empty(config, 2, 12)
                logits, cache = mixtral.prefill(params, prompt, cache, **static)
                first = jnp.argmax(logits, axis=-1).astype(jnp.int32)
                step_logits, cache = mixtral.decode_step(params, first, cache, 6, **static)
                emitted, cache = mixtral.decode_loop(params, first, cache, 7, steps=3, **static)
        finally:
            jax.clear_caches()
        return logits, step_logits, emitted, cache

    def check(field: str, values: tuple[str, str], base: KernelChoices = DEFAULT_CHOICES) -> None:
        (logits_a, step_a, tokens_a, cache_a), (logits_b, step_b, tokens_b, cache_b) = (
            decode(dataclasses.replace(base, **{field: value})) for value in values
        )
        np.testing.assert_allclose(np.asarray(logits_a), np.asarray(logits_b), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(np.asarray(step_a), np.asarray(step_b), rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(np.asarray(tokens_a), np.asarray(tokens_b))
        for a, b in zip(jax.tree.leaves(cache_a), jax.tree.leaves(cache_b), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)

    return check
