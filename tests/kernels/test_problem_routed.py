"""Problem's top_k, for an op that routes its tokens itself (the fused MoE decode block): v3 keys and
dicts that name it, every v1 and v2 key and dict unchanged, and the rules between top_k and the op."""

import pytest

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.problem import Problem

BLOCK = "moe_decode_block"


def _block(**fields) -> Problem:
    return Problem(**(dict(op=BLOCK, m=8, k=2048, n=1536, g=128, top_k=8) | fields))


def test_a_routed_problem_has_a_v3_key_naming_its_top_k_and_round_trips():
    problem = _block()
    assert problem.key == (
        "moe_decode_block/m=8,k=2048,n=1536,g=128,lhs=bfloat16,rhs=bfloat16,out=bfloat16,t=0,top_k=8/v3"
    )
    assert problem.shape_key == problem.key.replace("m=8,", "")
    assert problem.to_dict() == {
        "schema_version": 3, "op": BLOCK, "m": 8, "k": 2048, "n": 1536, "g": 128, "lhs_dtype": "bfloat16",
        "rhs_dtype": "bfloat16", "out_dtype": "bfloat16", "transpose_rhs": False, "top_k": 8,
    }  # fmt: skip
    assert Problem.from_json(problem.to_json()) == problem
    assert Problem.top_k_of_key(problem.key) == 8
    assert _block(top_k=10, g=512).key != _block(g=512).key  # each top_k is tuned apart


def test_a_block_on_k_major_weights_is_keyed_t1_and_round_trips():
    problem = _block(transpose_rhs=True)
    assert problem.key == (
        "moe_decode_block/m=8,k=2048,n=1536,g=128,lhs=bfloat16,rhs=bfloat16,out=bfloat16,t=1,top_k=8/v3"
    )
    assert problem.to_dict()["transpose_rhs"] is True
    assert Problem.from_json(problem.to_json()) == problem and problem != _block()
    assert problem.rhs_shape == (128, 1536, 2048)  # w_gate_up [E, 2F, H]


def test_keys_and_dicts_without_a_top_k_are_unchanged():
    plain = Problem("grouped_matmul", m=4096, k=4096, n=28672, g=8)
    assert plain.key.endswith(",t=0/v1") and "top_k" not in plain.to_dict()
    assert Problem.top_k_of_key(plain.key) == 0
    fp8 = Problem(
        "grouped_matmul_fp8", 64, 256, 512, 4, "float8_e4m3fn", "float8_e4m3fn", scale_layout="tensor"
    )
    assert fp8.key.endswith(",t=0,s=tensor/v2") and "top_k" not in fp8.to_dict()


def test_top_k_belongs_to_routed_ops_and_lies_in_one_to_g():
    with pytest.raises(ConfigInvalid, match="op=moe_decode_block routes its tokens: it takes top_k in"):
        _block(top_k=0)
    with pytest.raises(ConfigInvalid, match=r"top_k in \[1, g=128\], not 129"):
        _block(top_k=129)
    with pytest.raises(ConfigInvalid, match="op=grouped_matmul takes no top_k"):
        Problem("grouped_matmul", 8, 8, 8, 2, top_k=2)
    with pytest.raises(ConfigInvalid, match="top_k=True must be a non-negative integer"):
        _block(top_k=True)
    with pytest.raises(ConfigInvalid, match="a schema_version=3 problem needs a top_k"):
        Problem.from_dict(Problem("grouped_matmul", 8, 8, 8, 2).to_dict() | {"schema_version": 3})
    with pytest.raises(ConfigInvalid, match="a schema_version=1 problem has no top_k"):
        Problem.from_dict(_block().to_dict() | {"schema_version": 1})


def test_the_block_takes_one_16_or_32_bit_dtype_and_an_even_n():
    assert _block(lhs_dtype="f32", rhs_dtype="f32", out_dtype="f32").lhs_dtype == "float32"
    with pytest.raises(ConfigInvalid, match="takes one dtype for x, the weights and the output"):
        _block(out_dtype="float32")
    with pytest.raises(ConfigInvalid, match="takes lhs dtypes bfloat16, float16, float32, not float8"):
        _block(lhs_dtype="float8_e4m3fn", rhs_dtype="float8_e4m3fn")
    with pytest.raises(ConfigInvalid, match="needs an even n"):
        _block(n=1535)
