"""Models and sweep files -> Problems; single-problem strings; the sweep spec and its overrides."""

from __future__ import annotations

import pytest

from moetune.kernels import registry
from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.moe import moe_problems
from moetune.tuner.plan import (
    DEFAULT_TOKEN_BUCKETS,
    ModelShapes,
    PlannedProblem,
    as_fp8,
    decode_block_problems,
    dedupe,
    dispatched_on,
    for_backend,
    load_model,
    parse_problem,
    with_backward,
)
from moetune.tuner.spec import SweepSpec, load_sweep_file, shipped_sweep_names


def test_mixtral_8x7b_yields_gate_up_and_down_per_bucket():
    model = load_model("mixtral-8x7b")
    assert (model.experts, model.top_k, model.hidden, model.ffn) == (8, 2, 4096, 14336)
    assert model.token_buckets == DEFAULT_TOKEN_BUCKETS == tuple(2**i for i in range(15))
    problems = {p.label: p.problem for p in model.problems()}
    assert len(problems) == 2 * 15
    gate_up, down = problems["mixtral-8x7b gate_up T=4096"], problems["mixtral-8x7b down T=4096"]
    assert (gate_up.m, gate_up.k, gate_up.n, gate_up.g) == (8192, 4096, 28672, 8)
    assert (down.m, down.k, down.n, down.g) == (8192, 14336, 4096, 8)
    assert gate_up.lhs_dtype == gate_up.rhs_dtype == gate_up.out_dtype == "bfloat16"


def test_model_problems_are_what_moe_mlp_dispatches():
    # The winners a sweep stores must be the ones moe_mlp looks up: same op, shapes and dtypes.
    model = load_model("mixtral-8x7b")
    for tokens in (1, 4096):
        planned = {p.label: p.problem for p in model.with_buckets((tokens,)).problems()}
        gate_up, down = moe_problems(tokens, model.hidden, model.ffn, model.experts, model.top_k)
        assert planned[f"mixtral-8x7b gate_up T={tokens}"] == gate_up
        assert planned[f"mixtral-8x7b down T={tokens}"] == down
        assert gate_up.op == "grouped_matmul_swiglu" and gate_up.out_n == model.ffn


def test_geglu_tunes_its_fused_op_where_served_and_the_plain_gemm_elsewhere():
    model = ModelShapes("m", experts=4, top_k=2, hidden=64, ffn=32, token_buckets=(4,), activation="geglu")
    planned = model.problems()
    assert [p.problem.op for p in planned] == ["grouped_matmul_geglu", "grouped_matmul"]
    assert tuple(p.problem for p in planned) == moe_problems(4, 64, 32, 4, 2, activation="geglu")
    assert [p.problem.op for p in dispatched_on(planned, registry.get("xla"))] == [
        "grouped_matmul_geglu",
        "grouped_matmul",
    ]
    # mosaic_gpu fuses only SwiGLU: its geglu layer runs the plain gate_up GEMM, then the activation.
    assert [p.problem.op for p in dispatched_on(planned, registry.get("mosaic_gpu"))] == [
        "grouped_matmul"
    ] * 2
    with pytest.raises(ConfigInvalid, match="activation='relu'; known: geglu, swiglu"):
        ModelShapes("m", experts=4, top_k=2, hidden=64, ffn=32, activation="relu")


def test_for_backend_unfuses_where_the_backend_does_not_serve_the_op():
    gate_up = load_model("mixtral-8x7b").with_buckets((16,)).problems()[0]
    assert gate_up.problem.op == "grouped_matmul_swiglu"
    assert for_backend(gate_up, registry.get("xla")) == gate_up  # xla serves the fused op
    unfused = for_backend(gate_up, registry.get("flydsl"))  # FlyDSL's kernel is the plain GEMM
    assert unfused.problem.op == "grouped_matmul" and unfused.label == gate_up.label
    assert (unfused.problem.m, unfused.problem.n, unfused.problem.out_n) == (32, 28672, 28672)


def test_parse_problem_names_the_fused_op():
    fused = parse_problem("op=grouped_matmul_swiglu,m=2,k=4096,n=28672,g=8,dtype=bf16")
    assert (fused.problem.op, fused.problem.out_n) == ("grouped_matmul_swiglu", 14336)
    assert fused.label == "grouped_matmul_swiglu m=2,k=4096,n=28672,g=8"
    geglu = parse_problem("op=grouped_matmul_geglu,m=2,k=4096,n=28672,g=8,dtype=bf16")
    assert (geglu.problem.op, geglu.problem.out_n) == ("grouped_matmul_geglu", 14336)
    known = "grouped_matmul, grouped_matmul_drhs, grouped_matmul_fp8, grouped_matmul_geglu, "
    known += "grouped_matmul_swiglu,"
    with pytest.raises(ConfigInvalid, match=f"op='gemm'; known: {known}"):
        parse_problem("op=gemm,m=2,k=4,n=4,g=1")
    # An op whose output is one slice per expert is tuned like any other.
    drhs = parse_problem("op=grouped_matmul_drhs,m=2,k=4,n=6,g=3")
    assert (drhs.problem.op, drhs.problem.out_shape) == ("grouped_matmul_drhs", (3, 4, 6))


def test_mixtral_8x22b_shapes():
    problems = {p.label: p.problem for p in load_model("mixtral-8x22b").problems()}
    gate_up = problems["mixtral-8x22b gate_up T=1"]
    assert (gate_up.m, gate_up.k, gate_up.n, gate_up.g) == (2, 6144, 32768, 8)
    down = problems["mixtral-8x22b down T=16384"]
    assert (down.m, down.k, down.n, down.g) == (32768, 16384, 6144, 8)


def test_any_model_works_from_its_yaml_alone(tmp_path):
    path = tmp_path / "my-moe.yaml"
    path.write_text(
        "name: my-moe\nexperts: 64\ntop_k: 6\nhidden: 2048\nffn: 1408\n"
        "lhs_dtype: bf16\nrhs_dtype: bf16\nout_dtype: f32\ntoken_buckets: [16, 2]\n"
    )
    model = load_model(str(path))
    assert model.token_buckets == (2, 16)
    first = model.problems()[0].problem
    assert (first.m, first.k, first.n, first.g, first.out_dtype) == (12, 2048, 2816, 64, "float32")


@pytest.mark.parametrize(
    "text, message",
    [
        ("name: x\nexperts: 8\ntop_k: 2\nhidden: 64\n", "missing model fields ffn"),
        ("name: x\nexperts: 2\ntop_k: 4\nhidden: 64\nffn: 64\n", "top_k=4 exceeds experts=2"),
        ("name: x\nexperts: 8\ntop_k: 2\nhidden: 64\nffn: 64\nlayers: 3\n", "unknown model fields layers"),
        ("name: x\nexperts: 8\ntop_k: 2\nhidden: 64\nffn: 0\n", "ffn=0 must be a positive integer"),
        (
            "name: x\nexperts: 8\ntop_k: 2\nhidden: 64\nffn: 64\ntoken_buckets: 4\n",
            "token_buckets must be a list",
        ),
    ],
)
def test_bad_model_files_fail_with_the_reason(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigInvalid, match=message):
        load_model(str(path))


def test_unknown_model_name_lists_the_shipped_ones():
    with pytest.raises(ConfigInvalid, match="shipped models: .*mixtral-8x7b.*tiny"):
        load_model("no-such-model")


def test_parse_problem():
    planned = parse_problem("m=8192,k=4096,n=28672,g=8,dtype=bf16")
    p = planned.problem
    assert (p.m, p.k, p.n, p.g, p.lhs_dtype, p.out_dtype, p.transpose_rhs) == (
        8192,
        4096,
        28672,
        8,
        "bfloat16",
        "bfloat16",
        False,
    )
    q = parse_problem("m=16, k=64, n=64, g=4, dtype=bf16, out=f32, t=1").problem
    assert (q.out_dtype, q.transpose_rhs) == ("float32", True)


def test_an_fp8_problem_is_written_as_its_key_reads_and_its_output_stays_bfloat16():
    planned = parse_problem(
        "op=grouped_matmul_fp8,m=4096,k=7168,n=4096,g=256,dtype=e4m3,s=block_1x128_128x128"
    )
    p = planned.problem
    assert p.key.endswith("lhs=float8_e4m3fn,rhs=float8_e4m3fn,out=bfloat16,t=0,s=block_1x128_128x128/v2")
    assert (
        planned.label == "grouped_matmul_fp8 m=4096,k=7168,n=4096,g=256,float8_e4m3fn,s=block_1x128_128x128"
    )
    swiglu = parse_problem(
        "op=grouped_matmul_swiglu_fp8,m=8,k=256,n=512,g=4,lhs=e4m3,rhs=e4m3,scale_layout=tensor"
    )
    assert swiglu.problem.scale_layout == "tensor" and swiglu.problem.out_dtype == "bfloat16"


def test_a_routed_problem_names_its_top_k_as_its_key_reads():
    planned = parse_problem("op=moe_decode_block,m=8,k=2048,n=1536,g=128,top_k=8")
    assert planned.problem.key.endswith(",t=0,top_k=8/v3") and planned.problem.m == 8
    assert planned.label == "moe_decode_block m=8,k=2048,n=1536,g=128,top_k=8"
    assert planned.rows == 64  # the routing draws spread the tokens' 8 choices each


@pytest.mark.parametrize(
    "text, message",
    [
        ("m=1,k=2,n=3", "missing g"),
        ("op=moe_decode_block,m=8,k=64,n=64,g=8", "routes its tokens: it takes top_k"),
        ("op=moe_decode_block,m=8,k=64,n=64,g=8,top_k=x", "top_k='x' is not a positive integer"),
        ("m=8,k=64,n=64,g=8,top_k=2", "op=grouped_matmul takes no top_k"),
        ("m=x,k=2,n=3,g=1", "m='x' is not a positive integer"),
        ("m=1,k=2,n=3,g=1,z=4", "unknown field 'z'"),
        ("m=1,k=2,n=3,g=1,dtype=int8", "dtype='int8'"),
        ("m=1,k", "is not name=value"),
        ("op=grouped_matmul_fp8,m=4,k=128,n=128,g=2,dtype=e4m3", "takes scale_layout one of tensor"),
        ("m=4,k=128,n=128,g=2,s=tensor", "op=grouped_matmul takes scale_layout 'none'"),
        ("op=grouped_matmul_fp8,m=4,k=100,n=128,g=2,dtype=e4m3,s=block_1x128_128x128", "multiples of 128"),
    ],
)
def test_parse_problem_errors(text, message):
    with pytest.raises(ConfigInvalid, match=message):
        parse_problem(text)


def test_dedupe_keeps_the_first_label():
    a = parse_problem("op=grouped_matmul_geglu,m=2,k=64,n=64,g=4")
    b = ModelShapes("m", experts=4, top_k=2, hidden=64, ffn=32, token_buckets=(1,), activation="geglu")
    b = b.problems()
    merged = dedupe([*b, a])
    assert [p.label for p in merged] == ["m gate_up T=1", "m down T=1"]


def test_sweep_file_flags_override(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("backend: xla\nmodel: tiny\nstrategy: tpe\nbudget: 8\nrouting: zipf:1.1\n")
    spec, source = load_sweep_file(str(path))
    assert (spec.backend, spec.models, spec.strategy, spec.budget) == ("xla", ("tiny",), "tpe", 8)
    assert source == str(path.resolve())
    flags = dict(strategy="grid", budget=None, models=(), minutes=2.0)
    merged = spec.override(**flags)
    assert (merged.strategy, merged.budget, merged.models, merged.minutes) == ("grid", 8, ("tiny",), 2.0)
    assert SweepSpec.from_dict(merged.to_dict()) == merged


def test_a_routing_list_in_a_sweep_file_means_several_routings(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("routing: [balanced, zipf:1.2]\n")
    spec, _ = load_sweep_file(str(path))
    assert spec.routing == "balanced,zipf:1.2"
    assert SweepSpec.from_dict(spec.to_dict()) == spec


def test_shipped_sweep_files_load():
    names = shipped_sweep_names()
    assert "quickstart" in names
    for name in names:
        spec, _ = load_sweep_file(name)
        assert spec.backend


@pytest.mark.parametrize(
    "data, message",
    [
        ({"budgte": 3}, "unknown sweep fields budgte"),
        ({"runs": 5}, "at least 10 runs"),
        ({"verify_draws": 1}, "two routing draws"),
        ({"min_gain": 2}, "min_gain"),
        ({"budget": 0}, "budget=0"),
        ({"models": "tiny"}, "models must be a list"),
        ({"routing": "zipf:1.2,skewed"}, "routing 'skewed'"),
        ({"routing": ["balanced", "balanced"]}, "same routing twice"),
        ({"models": ["tiny"], "fp8": "per_row"}, "fp8='per_row' is not a scale layout: tensor, row_channel"),
        ({"problems": ["m=8,k=128,n=128,g=2"], "fp8": "tensor"}, "fp8 puts the models' expert GEMMs"),
        ({"models": ["tiny"], "fp8": "tensor", "with_backward": True}, "the FP8 ops have no backward"),
    ],
)
def test_bad_sweep_settings(data, message):
    with pytest.raises(ConfigInvalid, match=message):
        SweepSpec.from_dict(data)


def test_fp8_experts_tune_the_fp8_ops_moe_mlp_dispatches_on_k_major_weights():
    planned = load_model("deepseek-v3").with_buckets((4096,)).problems()
    gate_up, down = as_fp8(planned, "block_1x128_128x128")
    assert gate_up.problem.key == (
        "grouped_matmul_swiglu_fp8/m=32768,k=7168,n=4096,g=256,lhs=float8_e4m3fn,rhs=float8_e4m3fn,"
        "out=bfloat16,t=1,s=block_1x128_128x128/v2"
    )
    assert down.problem.op == "grouped_matmul_fp8" and down.problem.transpose_rhs
    assert gate_up.label.endswith(" fp8")
    # A backend without the fused FP8 op runs the plain FP8 GEMM, its product in float32 for the activation.
    unfused = for_backend(gate_up, registry.get("flydsl"))
    assert (unfused.problem.op, unfused.problem.out_dtype) == ("grouped_matmul_fp8", "float32")
    assert for_backend(gate_up, registry.get("xla")) == gate_up
    # Block scales need whole 128-blocks along K and N; an op with no FP8 form is named.
    odd = ModelShapes.from_dict({"name": "odd", "experts": 4, "top_k": 2, "hidden": 200, "ffn": 256})
    with pytest.raises(ConfigInvalid, match="needs k and n multiples of 128"):
        as_fp8(odd.with_buckets((1,)).problems(), "block_1x128_128x128")
    assert len(as_fp8(odd.with_buckets((1,)).problems(), "row_channel")) == 2
    geglu = ModelShapes.from_dict(
        {"name": "g", "experts": 4, "top_k": 2, "hidden": 256, "ffn": 256, "activation": "geglu"}
    )
    with pytest.raises(ConfigInvalid, match="op=grouped_matmul_geglu has no FP8 form"):
        as_fp8(geglu.with_buckets((1,)).problems(), "tensor")


def test_filled_rows_round_trip_bound_by_m_and_carry_into_the_backward():
    problem = parse_problem("m=512,k=64,n=96,g=8,dtype=bf16").problem
    planned = PlannedProblem(problem, "buffer", tokens=64, filled_rows=128)
    assert planned.rows == 128 and PlannedProblem.from_dict(planned.to_dict()) == planned
    assert (
        PlannedProblem(problem, "whole").rows == 512
        and "filled_rows" not in PlannedProblem(problem, "x").to_dict()
    )
    for bad in (0, 513, True, 1.5):
        with pytest.raises(ConfigInvalid, match="filled_rows"):
            PlannedProblem(problem, "bad", filled_rows=bad)
    backward = with_backward([planned])
    assert [p.filled_rows for p in backward] == [128, 128, 128]


@pytest.mark.parametrize(
    "model, count, first",
    [
        ("qwen3-30b-a3b", 6, "m=1,k=2048,n=1536,g=128,lhs=bfloat16,rhs=bfloat16,out=bfloat16,t=0,top_k=8/v3"),
        (
            "qwen3-next-80b-a3b",
            6,
            "m=1,k=2048,n=1024,g=512,lhs=bfloat16,rhs=bfloat16,out=bfloat16,t=0,top_k=10/v3",
        ),
        ("mixtral-8x7b", 6, "m=1,k=4096,n=28672,g=8,lhs=bfloat16,rhs=bfloat16,out=bfloat16,t=0,top_k=2/v3"),
        ("deepseek-v3-ep8", 0, None),  # experts split across shards: the block's winners are whole layers'
    ],
)
def test_a_models_decode_block_problems_are_its_buckets_up_to_32_tokens(model, count, first):
    planned = decode_block_problems(load_model(model))
    assert len(planned) == count
    if count:
        assert planned[0].problem.key == f"moe_decode_block/{first}"
        assert [p.tokens for p in planned] == [1, 2, 4, 8, 16, 32] == [p.problem.m for p in planned]
        assert (
            planned[-1].label == f"{model} block T=32" and planned[-1].rows == 32 * planned[-1].problem.top_k
        )
    geglu = ModelShapes("m", experts=4, top_k=2, hidden=64, ffn=32, token_buckets=(1,), activation="geglu")
    assert decode_block_problems(geglu) == []


def test_a_sweep_asks_for_the_decode_block_of_its_models_only():
    assert SweepSpec(models=("tiny",), decode_block=True).decode_block
    with pytest.raises(ConfigInvalid, match="name a model"):
        SweepSpec(problems=("m=1,k=2,n=4,g=1",), decode_block=True)
    with pytest.raises(ConfigInvalid, match="drop with_backward or decode_block"):
        SweepSpec(models=("tiny",), decode_block=True, with_backward=True)


def test_fp8_experts_sweep_the_decode_block_on_fp8_weights():
    from moetune.tuner.sweep_setup import model_problems

    planned = model_problems(SweepSpec(models=("tiny",), decode_block=True, fp8="row_channel"))
    (block,) = [p.problem for p in planned if p.problem.spec.routed]  # tiny's one bucket of <= 32 tokens
    assert block.key == (
        "moe_decode_block_fp8/m=8,k=64,n=256,g=4,lhs=bfloat16,rhs=float8_e4m3fn,out=bfloat16,t=1,"
        "s=row_channel,top_k=2/v3"
    )
    assert {p.problem.op for p in planned} == {
        "grouped_matmul_swiglu_fp8", "grouped_matmul_fp8", "moe_decode_block_fp8"
    }  # fmt: skip
