"""The fused decode block as an op on a Hopper GPU: the heuristic's config of each development model at
T = 1, 8 and 32 compiles, runs within the op's tolerance and repeats bitwise; moe_mlp's "kernel" mode runs
it and recording() names it; "auto" keeps the unfused path without a winner; the block and its baseline on
K-major weights and on FP8 weights (moe_decode_block_fp8) meet the tolerance."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels import ops, recording, registry
from moetune.kernels.device import current_fingerprint
from moetune.kernels.lookup import LOOKUP
from moetune.kernels.moe import layer
from moetune.kernels.problem import Problem
from moetune.kernels.reference import reference_of, relative_error
from moetune.tuner.routing import Routing

pytestmark = pytest.mark.gpu

# (experts, top_k, hidden, ffn): Qwen3-30B-A3B, Qwen3-Next-80B-A3B, Mixtral-8x7B
MODELS = {
    "qwen3-30b-a3b": (128, 8, 2048, 768),
    "qwen3-next-80b-a3b": (512, 10, 2048, 512),
    "mixtral-8x7b": (8, 2, 4096, 14336),
}
SPEC = ops.get("moe_decode_block")


@pytest.fixture(autouse=True)
def packs_only():
    with LOOKUP.using_db(None):
        yield


def _operands(problem: Problem, seed: int = 0):
    keys = jax.random.split(jax.random.key(seed), 3)
    x, w_gate_up, w_down = (
        SPEC.draw(problem, o.name, k) for o, k in zip(SPEC.drawn_operands, keys, strict=True)
    )
    # A uniform draw of the tokens' choices, at most one per token on an expert (the tuner's own).
    sizes = Routing("zipf").group_sizes(SPEC.routing_rows(problem), problem.g, seed=seed, capacity=problem.m)
    logits = SPEC.operand("router_logits").from_routing(problem, sizes, seed)
    return x, logits, w_gate_up, w_down


@pytest.mark.parametrize("tokens", [1, 8, 32])
@pytest.mark.parametrize("model", list(MODELS))
def test_the_heuristics_config_runs_within_the_ops_tolerance(model, tokens):
    experts, top_k, hidden, ffn = MODELS[model]
    problem = Problem("moe_decode_block", tokens, hidden, 2 * ffn, experts, top_k=top_k)
    backend = registry.get("mosaic_gpu")
    config = backend.heuristic(problem, current_fingerprint())
    kernel = jax.jit(backend.build(problem, config))
    args = _operands(problem, seed=tokens)
    first, second = kernel(*args), kernel(*args)
    assert np.array_equal(np.asarray(first), np.asarray(second)), config  # deterministic
    error = relative_error(first, reference_of(problem)(*args))
    assert error <= SPEC.tolerance_for("bfloat16"), (config, error)


def test_kernel_mode_runs_and_records_the_block_and_auto_keeps_the_unfused_path_untuned():
    experts, top_k, hidden, ffn = MODELS["qwen3-30b-a3b"]
    problem = Problem("moe_decode_block", 4, hidden, 2 * ffn, experts, top_k=top_k)
    x, logits, w_gate_up, w_down = _operands(problem)
    with LOOKUP.overlay(packs_dir=None):
        with recording() as calls:
            out = layer.moe_mlp(x, logits, w_gate_up, w_down, top_k=top_k, decode_mode="kernel")
        assert [(c.problem, c.backend, c.source) for c in calls] == [(problem, "mosaic_gpu", "heuristic")]
        assert relative_error(out, reference_of(problem)(x, logits, w_gate_up, w_down)) <= 1e-2
        with recording() as calls:
            layer.moe_mlp(x, logits, w_gate_up, w_down, top_k=top_k)
        assert "moe_decode_block" not in [c.problem.op for c in calls]
        choice = layer.decode_choice(x, logits, w_gate_up, top_k)
        assert choice.config is None and choice.reason.startswith("no tuned winner for moe_decode_block/m=4,")
    assert out.dtype == jnp.bfloat16


@pytest.mark.parametrize("tokens", [1, 32])
def test_k_major_weights_run_the_heuristics_block_and_its_baseline_within_the_ops_tolerance(tokens):
    experts, top_k, hidden, ffn = MODELS["qwen3-30b-a3b"]
    problem = Problem("moe_decode_block", tokens, hidden, 2 * ffn, experts, transpose_rhs=True, top_k=top_k)
    backend = registry.get("mosaic_gpu")
    args = _operands(problem, seed=tokens)
    assert args[2].shape == (experts, 2 * ffn, hidden) and args[3].shape == (experts, hidden, ffn)
    reference = reference_of(problem)(*args)
    for config in (
        backend.heuristic(problem, current_fingerprint()),
        backend.search_space(problem, current_fingerprint()).baseline,
    ):
        out = jax.jit(backend.build(problem, config))(*args)
        assert relative_error(out, reference) <= SPEC.tolerance_for("bfloat16"), config


@pytest.mark.parametrize("layout", ["row_channel", "block_1x128_128x128"])
def test_fp8_weights_run_the_heuristics_block_and_its_baseline_within_the_ops_tolerance(layout):
    experts, top_k, hidden, ffn = MODELS["qwen3-30b-a3b"]
    problem = Problem(
        "moe_decode_block_fp8", 8, hidden, 2 * ffn, experts, "bfloat16", "float8_e4m3fn", "bfloat16",
        transpose_rhs=True, scale_layout=layout, top_k=top_k,
    )  # fmt: skip
    spec = ops.get("moe_decode_block_fp8")
    keys = jax.random.split(jax.random.key(0), 3)
    x, (w_gate_up, gate_up_scale), (w_down, down_scale) = (
        spec.draw(problem, o.name, k) for o, k in zip(spec.drawn_operands, keys, strict=True)
    )
    sizes = Routing("zipf").group_sizes(spec.routing_rows(problem), problem.g, seed=0, capacity=problem.m)
    logits = spec.operand("router_logits").from_routing(problem, sizes, 0)
    args = (x, logits, w_gate_up, gate_up_scale, w_down, down_scale)
    reference = reference_of(problem)(*args)
    backend = registry.get("mosaic_gpu")
    fused = backend.heuristic(problem, current_fingerprint())
    out = jax.jit(backend.build(problem, fused))(*args)
    assert relative_error(out, reference) <= 1e-2, fused  # x stays bf16: a bf16 block's rounding
    baseline = backend.search_space(problem, current_fingerprint()).baseline
    out = jax.jit(backend.build(problem, baseline))(*args)
    assert relative_error(out, reference) <= spec.tolerance_for("bfloat16")
