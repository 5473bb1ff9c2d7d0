"""The config pack format: typed and bounded field by field, read only from small regular files, and its
published JSON Schema the one the models generate."""

from __future__ import annotations

import copy
import dataclasses
import importlib.resources
import json
import os

import pytest

from moetune.kernels import pack_schema, packs
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import PackInvalid
from moetune.kernels.problem import Problem

SHIPPED = importlib.resources.files("moetune.configs") / "tuned" / "nvidia_h200__mosaic_gpu.json"


@pytest.fixture(scope="module")
def shipped() -> dict:
    return json.loads(SHIPPED.read_text())


def _problem(d):
    return d["entries"][0]["problem"]


def _config(d):
    return d["entries"][0]["config"]


@pytest.mark.parametrize(
    ("mutate", "expect"),
    [
        (lambda d: _problem(d).update(op="<script>alert(1)</script>"), "entries[0].problem.op="),
        (lambda d: _problem(d).update(op="attention"), "op 'attention' is not one of grouped_matmul"),
        (lambda d: _problem(d).update(m=2**63), "entries[0].problem.m=9223372036854775808"),
        (lambda d: _problem(d).update(m=2**31), "less than or equal to 2147483647"),
        (lambda d: _problem(d).update(k=0), "entries[0].problem.k=0"),
        (lambda d: _problem(d).update(n="4096"), "entries[0].problem.n='4096'"),
        (lambda d: _problem(d).update(g=8.0), "entries[0].problem.g=8.0"),
        (lambda d: _problem(d).update(m=True), "entries[0].problem.m=True"),
        (lambda d: _problem(d).update(lhs_dtype="bf16"), "entries[0].problem.lhs_dtype='bf16'"),
        (lambda d: _problem(d).update(transpose_rhs=0), "entries[0].problem.transpose_rhs=0"),
        (lambda d: _problem(d).pop("g"), "entries[0].problem.g: missing field"),
        (lambda d: _problem(d).update(group_sizes=[1, 2]), "entries[0].problem.group_sizes: unknown field"),
        # Version 2 is a problem with scales: without them it is incomplete.
        (lambda d: _problem(d).update(schema_version=2), "entries[0].problem.scale_layout: missing field"),
        # Version 3 is a problem of an op routing its tokens: without a top_k it is incomplete.
        (lambda d: _problem(d).update(schema_version=3), "entries[0].problem.top_k: missing field"),
        (lambda d: _problem(d).update(schema_version=4), "entries[0].problem="),
        (
            lambda d: _problem(d).update(op="grouped_matmul_swiglu", n=28673),
            "entries[0].problem: op=grouped_matmul_swiglu needs an even n",
        ),
        (lambda d: _config(d).update(block_m=8 * 10**30), "does not fit a 32-bit integer"),
        (lambda d: _config(d).update(block_m=[64]), "not list"),
        (
            lambda d: _config(d).update(wg_split="n" * 65),
            "text of at most 64 characters, none a control character",
        ),
        (lambda d: _config(d).update({"Block-M": 64}), "entries[0].config.Block-M="),
        (lambda d: _config(d).update({f"p{i}": 1 for i in range(70)}), "at most 64 items"),
        (lambda d: d["entries"][0].update(median_s=0), "entries[0].median_s=0"),
        (lambda d: d["entries"][0].update(median_s="fast"), "entries[0].median_s='fast'"),
        (lambda d: d["entries"][0].pop("median_s"), "entries[0].median_s: missing field"),
        (lambda d: d["entries"][0].update(note="x"), "entries[0].note: unknown field"),
        (lambda d: d["device"].update(device_kind="x" * 129), "at most 128 characters"),
        (lambda d: d["device"].update(device_kind=""), "at least 1 character"),
        (
            lambda d: d["device"].update(driver="580\n.1"),
            "device.driver='580\\n.1': holds a control character",
        ),
        (lambda d: d["device"].update(platform="\x1b[31mgpu"), "holds a control character"),
        (lambda d: d["device"].update(core_count=2**31), "device.core_count=2147483648"),
        (lambda d: d["device"].update(core_count=-1), "device.core_count=-1"),
        (lambda d: d["device"].update(memory_bytes=2**63), "device.memory_bytes=9223372036854775808"),
        (lambda d: d["device"].update(gpu_count=8), "device.gpu_count: unknown field"),
        (lambda d: d.update(backend="Mosaic GPU"), "backend='Mosaic GPU': must be lowercase letters"),
        (lambda d: d.update(backend="b" * 65), "at most 64 characters"),
        (lambda d: d.update(kernel_source_hash="ab cd"), "kernel_source_hash='ab cd'"),
        (lambda d: d.update(kernel_source_hash=""), "kernel_source_hash=''"),
        (lambda d: d.update(created="yesterday"), "created='yesterday': is not a time"),
        (lambda d: d.update(created="2026-13-40T00:00:00Z"), "month must be in 1..12"),
        (lambda d: d.update(entries={}), "entries={}: input should be a valid list"),
        (lambda d: d.update(extra={}), "extra: unknown field"),
        (lambda d: d.update(schema_version="1"), "schema_version='1'; this moetune reads 1"),
        (lambda d: d.update(schema="moetune.pack.v2"), "not a moetune config pack"),
    ],
)
def test_every_field_is_typed_and_bounded(shipped, mutate, expect):
    data = copy.deepcopy(shipped)
    mutate(data)
    with pytest.raises(PackInvalid) as caught:
        packs.parse(data, "p.json")
    message = str(caught.value)
    assert message.startswith("p.json: ") and expect in message, message
    assert "\n" not in message


def test_the_shipped_pack_parses_to_frozen_values(shipped):
    pack = packs.parse(shipped, "shipped")
    assert isinstance(pack.device, DeviceFingerprint) and pack.device.device_kind == "NVIDIA H200"
    assert all(isinstance(e.problem, Problem) for e in pack.entries)
    assert json.loads(pack.dumps()) == shipped  # nothing lost, nothing added


def test_the_models_name_the_fields_of_the_values_they_build():
    assert set(pack_schema.DeviceModel.model_fields) == {
        f.name for f in dataclasses.fields(DeviceFingerprint)
    }
    # v1 problems have no scale_layout or top_k (Problem.to_dict leaves them out for them); v2 problems
    # have a scale_layout, v3 problems a top_k.
    fields = {f.name for f in dataclasses.fields(Problem)} | {"schema_version"}
    assert set(pack_schema.ProblemModel.model_fields) == fields - {"scale_layout", "top_k"}
    assert set(pack_schema.ScaledProblemModel.model_fields) == fields - {"top_k"}
    assert set(pack_schema.RoutedProblemModel.model_fields) == fields - {"scale_layout"}


def test_the_published_schema_is_the_one_the_models_generate():
    published = (importlib.resources.files("moetune.configs") / "pack.schema.json").read_text()
    assert published == pack_schema.json_schema_text(), (
        "configs/pack.schema.json is out of date: moetune pack-schema > configs/pack.schema.json"
    )


def test_the_schema_refuses_what_the_models_refuse():
    schema = pack_schema.json_schema()
    problem = schema["$defs"]["ProblemModel"]
    assert problem["additionalProperties"] is False and problem["properties"]["m"]["maximum"] == 2**31 - 1
    config = schema["$defs"]["EntryModel"]["properties"]["config"]
    assert config["additionalProperties"] is False and config["maxProperties"] == 64


# --- reading files --------------------------------------------------------------------------------


def _write(tmp_path, text: str | bytes, name: str = "p.json"):
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


@pytest.mark.parametrize(
    ("content", "expect"),
    [
        ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply"),
        ('{"a": NaN}', "NaN is not a JSON number"),
        ('{"a": Infinity}', "Infinity is not a JSON number"),
        ('{"schema": "moetune.pack", "schema": "x"}', "key 'schema' appears twice"),
        (b'{"schema": "\xff"}', "not UTF-8 text (byte 12)"),
        ("1" * 5000, "not valid JSON"),
        ("{ this is not json", "not valid JSON"),
        ("", "not valid JSON"),
    ],
)
def test_undecodable_files_are_refused_in_one_line(tmp_path, content, expect):
    path = _write(tmp_path, content)
    with pytest.raises(PackInvalid, match="cannot read pack") as caught:
        packs.load(path)
    assert expect in str(caught.value) and "\n" not in str(caught.value)


def test_only_regular_files_are_read(tmp_path):
    os.mkfifo(tmp_path / "fifo.json")  # reading it would block until a writer appears
    (tmp_path / "folder.json").mkdir()
    for path, kind in (
        (tmp_path / "fifo.json", "a FIFO"),
        (tmp_path / "folder.json", "a directory"),
        ("/dev/zero", "a character device"),
    ):
        with pytest.raises(PackInvalid, match=f"it is {kind}, not a regular file"):
            packs.load(path)
    with pytest.raises(PackInvalid, match="No such file or directory"):
        packs.load(tmp_path / "missing.json")


def test_a_file_past_the_cap_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = _write(tmp_path, " " * 2000 + "{}")
    monkeypatch.setattr(packs, "MAX_PACK_BYTES", 2001)
    with pytest.raises(PackInvalid, match="holds 2002 bytes; the limit is 2001"):
        packs.load(path)
    monkeypatch.setattr(packs, "MAX_PACK_BYTES", 2002)
    with pytest.raises(PackInvalid, match="not a moetune config pack"):  # read, parsed, and refused
        packs.load(path)


def test_the_pack_schema_command_prints_the_published_schema():
    from typer.testing import CliRunner

    # Imported for their commands (with one command alone, Typer would make it the whole app).
    import moetune.cli.db_commands  # noqa: F401
    import moetune.cli.pack_schema  # noqa: F401
    from moetune.cli import app

    result = CliRunner().invoke(app, ["pack-schema"])
    assert result.exit_code == 0
    assert result.stdout == (importlib.resources.files("moetune.configs") / "pack.schema.json").read_text()


def test_a_pack_of_scaled_problems_is_version_2_and_a_version_1_pack_cannot_hold_one(shipped):
    fp8 = {
        "schema_version": 2, "op": "grouped_matmul_fp8", "m": 64, "k": 256, "n": 512, "g": 8,
        "lhs_dtype": "float8_e4m3fn", "rhs_dtype": "float8_e4m3fn", "out_dtype": "bfloat16",
        "transpose_rhs": False, "scale_layout": "block_1x128_128x128",
    }  # fmt: skip
    entry = {"problem": fp8, "config": {"strategy": "ragged_dot"}, "median_s": 1e-4}
    # The shipped pack's 16-bit GEMM winners (it ships FP8 and routed ones too), so that the scaled entry is
    # the only one.
    unscaled = [e for e in shipped["entries"] if not {"scale_layout", "top_k"} & set(e["problem"])]
    assert unscaled
    scaled = shipped | {"schema_version": 2, "entries": [*unscaled, entry]}
    pack = packs.parse(scaled, "scaled")
    assert pack.schema_version == 2 and pack.entries[-1].problem.scale_layout == "block_1x128_128x128"
    assert json.loads(pack.dumps()) == scaled
    last = len(scaled["entries"]) - 1
    with pytest.raises(PackInvalid, match=rf"entries\[{last}\].problem has scales .* schema_version=1 pack"):
        packs.parse(scaled | {"schema_version": 1}, "old")
    # A v2 problem without scales, or FP8 operands in a v1 problem, are refused by the schema.
    for bad in (fp8 | {"scale_layout": "none"}, {**fp8, "schema_version": 1}):
        with pytest.raises(PackInvalid):
            packs.parse(scaled | {"entries": [entry | {"problem": bad}]}, "bad")
    assert packs.parse(shipped | {"schema_version": 1, "entries": unscaled}, "old").schema_version == 1


def test_a_pack_of_routed_problems_is_version_3_and_older_packs_cannot_hold_one(shipped):
    block = {
        "schema_version": 3, "op": "moe_decode_block", "m": 8, "k": 2048, "n": 1536, "g": 128,
        "lhs_dtype": "bfloat16", "rhs_dtype": "bfloat16", "out_dtype": "bfloat16", "transpose_rhs": False,
        "top_k": 8,
    }  # fmt: skip
    entry = {"problem": block, "config": {"strategy": "ragged_dot"}, "median_s": 1e-5}
    # The shipped pack's unrouted winners (it ships decode-block ones too), so that the entry added last
    # is the only routed one.
    unrouted = [e for e in shipped["entries"] if "top_k" not in e["problem"]]
    routed = shipped | {"schema_version": 3, "entries": [*unrouted, entry]}
    pack = packs.parse(routed, "routed")
    assert pack.schema_version == 3 and pack.entries[-1].problem.top_k == 8
    assert json.loads(pack.dumps()) == routed
    last = len(routed["entries"]) - 1
    with pytest.raises(PackInvalid, match=rf"entries\[{last}\].problem has a top_k .* schema_version=2 pack"):
        packs.parse(routed | {"schema_version": 2}, "old")
    with pytest.raises(PackInvalid, match=r"entries\[0\].problem has a top_k .* schema_version=1 pack"):
        packs.parse(routed | {"schema_version": 1, "entries": [entry]}, "old")
    # A v3 problem without a top_k, a top_k in an older problem, and a top_k outside [1, g] are refused.
    for bad in (
        {k: v for k, v in block.items() if k != "top_k"},
        block | {"schema_version": 1},
        block | {"top_k": 0},
        block | {"top_k": 129},
    ):
        with pytest.raises(PackInvalid):
            packs.parse(routed | {"entries": [entry | {"problem": bad}]}, "bad")
    # The shipped pack holds decode-block winners: it is a version 3 pack.
    assert packs.parse(shipped, "shipped").schema_version == shipped["schema_version"] == 3
