"""The shipped fine-grained model files, and the model fields they use: shared experts and EP/TP shards."""

from __future__ import annotations

import pytest

from moetune.kernels.errors import ConfigInvalid
from moetune.tuner.plan import SharedExperts, load_model, shipped_model_names


def _shapes(name: str, tokens: int) -> dict[str, tuple]:
    problems = load_model(name).with_buckets((tokens,)).problems()
    return {
        p.label.split()[1]: (p.problem.op, p.problem.m, p.problem.k, p.problem.n, p.problem.g)
        for p in problems
    }


def test_the_development_shapes_are_shipped():
    assert {"mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "deepseek-v3-ep8", "qwen3-next-80b-a3b"} <= set(
        shipped_model_names()
    )


@pytest.mark.parametrize(
    "name, gate_up, down, shared",
    [
        ("qwen3-30b-a3b", (8 * 8, 2048, 1536, 128), (8 * 8, 768, 2048, 128), None),
        ("deepseek-v3", (8 * 8, 7168, 4096, 256), (8 * 8, 2048, 7168, 256), SharedExperts(1, 2048)),
        # 8 shards: a shard's 8 tokens (64 in all) bring it 8 * 8 rows, over its 32 of the 256 experts.
        ("deepseek-v3-ep8", (8 * 8, 7168, 4096, 32), (8 * 8, 2048, 7168, 32), SharedExperts(1, 2048)),
        ("qwen3-next-80b-a3b", (8 * 10, 2048, 1024, 512), (8 * 10, 512, 2048, 512), SharedExperts(1, 512)),
        ("mixtral-8x7b", (8 * 2, 4096, 28672, 8), (8 * 2, 14336, 4096, 8), None),
    ],
)
def test_shipped_models_plan_the_routed_experts_grouped_gemms(name, gate_up, down, shared):
    shapes = _shapes(name, 8)
    # Two grouped GEMMs per bucket: the shared experts' dense GEMMs are not tuned.
    assert shapes == {"gate_up": ("grouped_matmul_swiglu", *gate_up), "down": ("grouped_matmul", *down)}
    assert load_model(name).shared_experts == shared


def test_the_ep8_shard_is_deepseek_v3_with_an_eighth_of_its_experts():
    full, shard = load_model("deepseek-v3"), load_model("deepseek-v3-ep8")
    assert (shard.ep, shard.local_experts, full.local_experts) == (8, 32, 256)
    assert (shard.experts, shard.top_k, shard.hidden, shard.ffn) == (
        full.experts,
        full.top_k,
        full.hidden,
        full.ffn,
    )


def test_model_files_may_shard_tensor_parallel(tmp_path):
    path = tmp_path / "tp.yaml"
    path.write_text("name: x\nexperts: 8\ntop_k: 2\nhidden: 64\nffn: 96\ntp: 2\ntoken_buckets: [4]\n")
    gate_up, down = (p.problem for p in load_model(str(path)).problems())
    assert (gate_up.n, gate_up.out_n, down.k, gate_up.m) == (96, 48, 48, 8)


@pytest.mark.parametrize(
    "extra, message",
    [
        ("shared_experts: 1\n", "shared_experts must be a mapping of count and ffn; got 1"),
        ("shared_experts: {count: 1}\n", "shared_experts must be a mapping of count and ffn"),
        ("shared_experts: {count: 0, ffn: 64}\n", "shared_experts.count=0 must be a positive integer"),
        ("tp: 5\n", "ffn=96 is not divisible by tp=5"),
        ("ep: 3\n", "experts=8 is not divisible by ep=3"),
        ("ep: 0\n", "ep=0 must be a positive integer"),
        ("tp: 3\nshared_experts: {count: 1, ffn: 64}\n", "shared_experts ffn=64 is not divisible by tp=3"),
    ],
)
def test_bad_shard_and_shared_expert_fields_fail_with_the_reason(tmp_path, extra, message):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nexperts: 8\ntop_k: 2\nhidden: 64\nffn: 96\n" + extra)
    with pytest.raises(ConfigInvalid, match=message):
        load_model(str(path))
