"""Problem's FP8 dtypes and scale layouts: v2 keys for scaled problems, every v1 key and dict unchanged."""

import importlib.resources
import json

import pytest

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.problem import Problem, problem_of

FP8 = "float8_e4m3fn"


def _fp8(layout: str = "row_channel", **fields) -> Problem:
    base = dict(op="grouped_matmul_fp8", m=64, k=256, n=512, g=4, lhs_dtype=FP8, rhs_dtype=FP8)
    return Problem(**(base | fields), scale_layout=layout)


def test_unscaled_keys_and_dicts_are_byte_identical_to_v1():
    problem = Problem("grouped_matmul", m=4096, k=4096, n=28672, g=8)
    assert problem.key == (
        "grouped_matmul/m=4096,k=4096,n=28672,g=8,lhs=bfloat16,rhs=bfloat16,out=bfloat16,t=0/v1"
    )
    assert problem.to_json() == (
        '{"g": 8, "k": 4096, "lhs_dtype": "bfloat16", "m": 4096, "n": 28672, "op": "grouped_matmul", '
        '"out_dtype": "bfloat16", "rhs_dtype": "bfloat16", "schema_version": 1, "transpose_rhs": false}'
    )


def test_every_shipped_pack_entry_reads_and_writes_back_unchanged():
    entries = [
        entry
        for pack in importlib.resources.files("moetune.configs").joinpath("tuned").iterdir()
        if pack.name.endswith(".json")
        for entry in json.loads(pack.read_text())["entries"]
    ]
    assert entries
    for entry in entries:
        assert Problem.from_dict(entry["problem"]).to_dict() == entry["problem"]


def test_a_scaled_problem_has_a_v2_key_naming_its_layout_and_round_trips():
    problem = _fp8("block_1x128_128x128", transpose_rhs=True)
    assert problem.key == (
        "grouped_matmul_fp8/m=64,k=256,n=512,g=4,lhs=float8_e4m3fn,rhs=float8_e4m3fn,out=bfloat16,t=1,"
        "s=block_1x128_128x128/v2"
    )
    assert problem.shape_key == problem.key.replace("m=64,", "")
    assert problem.to_dict()["schema_version"] == 2
    assert Problem.from_json(problem.to_json()) == problem
    assert _fp8("tensor").key != _fp8("row_channel").key


def test_layouts_and_dtypes_are_checked():
    with pytest.raises(ConfigInvalid, match="scale_layout='rowwise' is not one of none, tensor"):
        _fp8("rowwise")
    with pytest.raises(ConfigInvalid, match="op=grouped_matmul_fp8 takes scale_layout one of tensor"):
        _fp8("none")
    with pytest.raises(ConfigInvalid, match="op=grouped_matmul takes scale_layout 'none', not 'tensor'"):
        Problem("grouped_matmul", 8, 8, 8, 2, scale_layout="tensor")
    with pytest.raises(
        ConfigInvalid, match="takes lhs dtypes float8_e4m3fn, float8_e5m2, float8_e4m3fnuz, not bfloat16"
    ):
        _fp8(lhs_dtype="bfloat16")
    with pytest.raises(ConfigInvalid, match="dtype='float8_e4m3fn' is not one of bfloat16"):
        _fp8(out_dtype=FP8)
    with pytest.raises(ConfigInvalid, match="needs k and n multiples of 128; got k=200"):
        _fp8("block_1x128_128x128", k=200)
    with pytest.raises(ConfigInvalid, match="schema_version=1 problem has no scale_layout"):
        Problem.from_dict(_fp8().to_dict() | {"schema_version": 1})
    assert _fp8(lhs_dtype="e5m2").lhs_dtype == "float8_e5m2"


def test_problem_of_fp8_operands_defaults_to_a_bf16_output():
    import jax
    import jax.numpy as jnp

    lhs = jax.ShapeDtypeStruct((64, 256), jnp.float8_e4m3fn)
    rhs = jax.ShapeDtypeStruct((4, 256, 512), jnp.float8_e4m3fn)
    problem = problem_of(lhs, rhs, op="grouped_matmul_fp8", scale_layout="tensor")
    assert problem == _fp8("tensor")


def test_the_layout_reads_back_from_a_key():
    assert Problem.scale_layout_of_key(_fp8("tensor").key) == "tensor"
    assert Problem.scale_layout_of_key(Problem("grouped_matmul", 8, 8, 8, 2).key) == "none"
