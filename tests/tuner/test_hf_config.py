"""Hugging Face config.json -> ModelShapes per shard, and `moetune tune --hf-config [--tp N] [--ep N]`.

The fixtures in hf_configs/ are hand-written excerpts of each family's config.json: the field names of the
family's configuration class, the values of one published model of it (its name is the file's).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from moetune.cli import _load_commands, app
from moetune.kernels.errors import ConfigInvalid
from moetune.tuner.hf_config import FAMILIES, load_hf_config, load_reference, reference
from moetune.tuner.plan import SharedExperts, load_model

_load_commands()
CONFIGS = Path(__file__).parent / "hf_configs"

# file -> (model_type, experts, top_k, hidden, ffn, shared experts, activation, name)
EXPECTED = {
    "mixtral-8x7b": ("mixtral", 8, 2, 4096, 14336, None, "swiglu", "mixtral-8x7b-v0.1"),
    "qwen1.5-moe-a2.7b": ("qwen2_moe", 60, 4, 2048, 1408, SharedExperts(1, 5632), "swiglu", "qwen2-moe"),
    "qwen3-30b-a3b": ("qwen3_moe", 128, 8, 2048, 768, None, "swiglu", "qwen3-moe"),
    "qwen3-next-80b-a3b": ("qwen3_next", 512, 10, 2048, 512, SharedExperts(1, 512), "swiglu", "qwen3-next"),
    "deepseek-v2": ("deepseek_v2", 160, 6, 5120, 1536, SharedExperts(2, 1536), "swiglu", "deepseek-v2"),
    "deepseek-v3": ("deepseek_v3", 256, 8, 7168, 2048, SharedExperts(1, 2048), "swiglu", "deepseek-v3"),
    "deepseek-v3.2": ("deepseek_v32", 256, 8, 7168, 2048, SharedExperts(1, 2048), "swiglu", "deepseek-v32"),
    "kimi-k2": ("kimi_k2", 384, 8, 7168, 2048, SharedExperts(1, 2048), "swiglu", "kimi-k2"),
    "glm-4.5": ("glm4_moe", 160, 8, 5120, 1536, SharedExperts(1, 1536), "swiglu", "glm4-moe"),
    "gpt-oss-120b": ("gpt_oss", 128, 4, 2880, 2880, None, "clamped_swiglu", "gpt-oss"),
    "llama-4-scout-17b-16e": ("llama4", 16, 1, 5120, 8192, SharedExperts(1, 8192), "swiglu", "llama4"),
}


def _fixture(name: str) -> Path:
    return CONFIGS / f"{name}.json"


def _write(tmp_path: Path, config) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def _config(name: str) -> dict:
    return json.loads(_fixture(name).read_text())


def test_every_family_has_a_fixture():
    assert {v[0] for v in EXPECTED.values()} | {"llama4_text"} == set(FAMILIES)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_family_reads_its_own_field_names(name):
    model_type, experts, top_k, hidden, ffn, shared, activation, label = EXPECTED[name]
    model = load_hf_config(_fixture(name))
    assert _config(name)["model_type"] == model_type
    assert (model.experts, model.top_k, model.hidden, model.ffn) == (experts, top_k, hidden, ffn)
    assert (model.shared_experts, model.activation, model.name) == (shared, activation, label)
    assert model.lhs_dtype == model.rhs_dtype == model.out_dtype == "bfloat16"
    assert (model.tp, model.ep) == (1, 1)
    gate_up, down = model.with_buckets((4,)).problems()
    assert (gate_up.problem.m, gate_up.problem.k, gate_up.problem.n, gate_up.problem.g) == (
        4 * top_k,
        hidden,
        2 * ffn,
        experts,
    )
    assert (down.problem.k, down.problem.n) == (ffn, hidden)
    # moetune's fused SwiGLU epilogue is standard SwiGLU: gpt-oss's clamped one tunes the plain GEMM.
    assert gate_up.problem.op == ("grouped_matmul" if name == "gpt-oss-120b" else "grouped_matmul_swiglu")


def test_a_config_builds_the_same_problems_as_the_shipped_yaml():
    for name, yaml_name, shards in (
        ("qwen3-30b-a3b", "qwen3-30b-a3b", {}),
        ("deepseek-v3", "deepseek-v3", {}),
        ("deepseek-v3", "deepseek-v3-ep8", {"ep": 8}),
        ("qwen3-next-80b-a3b", "qwen3-next-80b-a3b", {}),
        ("mixtral-8x7b", "mixtral-8x7b", {}),
    ):
        from_hf, from_yaml = load_hf_config(_fixture(name), **shards), load_model(yaml_name)
        assert [p.problem for p in from_hf.problems()] == [p.problem for p in from_yaml.problems()], yaml_name
        assert from_hf.shared_experts == from_yaml.shared_experts


def test_tp_splits_each_experts_ffn_and_ep_splits_the_experts():
    model = load_hf_config(_fixture("deepseek-v3"), tp=2, ep=8).with_buckets((512,))
    assert model.name == "deepseek-v3-tp2-ep8" and (model.local_experts, model.shard_ffn) == (32, 1024)
    gate_up, down = (p.problem for p in model.problems())
    # A shard's 512 tokens' worth of rows (4096 tokens in all over 8 shards), over its 32 experts.
    assert (gate_up.m, gate_up.k, gate_up.n, gate_up.g) == (512 * 8, 7168, 2 * 1024, 32)
    assert (down.m, down.k, down.n, down.g) == (512 * 8, 1024, 7168, 32)
    assert model.shared_experts == SharedExperts(1, 2048)  # split by tp as the routed ffn is
    assert gate_up.op == "grouped_matmul_swiglu" and gate_up.out_n == 1024


@pytest.mark.parametrize(
    "shards, message",
    [
        ({"tp": 5}, "ffn=768 is not divisible by tp=5"),
        ({"ep": 3}, "experts=128 is not divisible by ep=3"),
        ({"tp": 0}, "tp=0 must be a positive integer"),
    ],
)
def test_shards_that_do_not_divide_the_model_are_refused(shards, message):
    with pytest.raises(ConfigInvalid, match=message):
        load_hf_config(_fixture("qwen3-30b-a3b"), **shards)


def test_a_shared_expert_ffn_that_tp_does_not_divide_is_refused(tmp_path):
    config = _config("qwen1.5-moe-a2.7b") | {"shared_expert_intermediate_size": 5630}
    with pytest.raises(ConfigInvalid, match="shared_experts ffn=5630 is not divisible by tp=4"):
        load_hf_config(_write(tmp_path, config), tp=4)


def test_no_shared_experts_where_their_count_or_size_is_zero(tmp_path):
    assert (
        load_hf_config(_write(tmp_path, _config("deepseek-v3") | {"n_shared_experts": 0})).shared_experts
        is None
    )
    qwen = _config("qwen1.5-moe-a2.7b") | {"shared_expert_intermediate_size": 0}
    assert load_hf_config(_write(tmp_path, qwen)).shared_experts is None


def test_dtype_and_top_k_fall_back_to_the_older_and_newer_spellings(tmp_path):
    config = _config("gpt-oss-120b")
    del config["num_experts_per_tok"]
    assert load_hf_config(_write(tmp_path, config)).top_k == 4  # experts_per_token
    config = _config("qwen3-30b-a3b")
    del config["torch_dtype"]
    assert load_hf_config(_write(tmp_path, config | {"dtype": "float16"})).lhs_dtype == "float16"
    assert load_hf_config(_write(tmp_path, config)).lhs_dtype == "bfloat16"  # neither: bfloat16
    gelu = _config("mixtral-8x7b") | {"hidden_act": "gelu_pytorch_tanh"}
    assert load_hf_config(_write(tmp_path, gelu)).activation == "geglu"
    text = _config("llama-4-scout-17b-16e")["text_config"]  # a text-only Llama 4 config
    assert load_hf_config(_write(tmp_path, text)).experts == 16


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "holds one object; this holds a list"),
        ('{"hidden_size": 64}', "no model_type; supported: mixtral, qwen2_moe"),
        ('{"model_type": "llama"}', "model_type 'llama' is not supported; supported: mixtral"),
        ('{"model_type": "qwen3_moe", "num_experts": 8, "hidden_size": 64}', "qwen3_moe config has no "),
        ('{"model_type": "llama4"}', "keeps its decoder in text_config; it has none"),
    ],
)
def test_bad_files_fail_with_the_reason(tmp_path, content, message):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(ConfigInvalid, match=message):
        load_hf_config(path)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"num_experts": "128"}, "num_experts='128' must be a positive integer"),
        ({"num_experts_per_tok": 0}, "num_experts_per_tok=0 must be a positive integer"),
        ({"num_experts_per_tok": 200}, "top_k=200 exceeds experts=128"),
        ({"torch_dtype": "float8_e4m3fn"}, "torch_dtype dtype='float8_e4m3fn' is not one of"),
        ({"hidden_act": "relu"}, "hidden_act='relu' is not a gated activation moetune tunes"),
    ],
)
def test_bad_fields_fail_naming_the_field(tmp_path, change, message):
    with pytest.raises(ConfigInvalid, match=message):
        load_hf_config(_write(tmp_path, _config("qwen3-30b-a3b") | change))


def test_a_path_that_is_no_file_is_refused(tmp_path):
    for path in (tmp_path / "missing.json", tmp_path):
        with pytest.raises(ConfigInvalid, match="cannot read --hf-config file .*(No such file|a directory)"):
            load_hf_config(path)


def test_a_reference_names_the_sharded_model_for_a_sweep(tmp_path):
    name = reference(_fixture("deepseek-v3"), tp=2, ep=8)
    assert name.startswith("hf:tp=2,ep=8:/")
    assert load_model(name) == load_hf_config(_fixture("deepseek-v3"), tp=2, ep=8)
    for bad in ("hf:tp=2", "hf:pp=2:" + str(_fixture("deepseek-v3")), "hf:tp=x:/c.json"):
        with pytest.raises(ConfigInvalid, match="expected hf:tp=N,ep=N:PATH"):
            load_reference(bad)


def invoke(*args):
    return CliRunner().invoke(app, list(args))


def test_tune_dry_run_plans_the_configs_per_shard_problems(sqlite_url):
    args = ["tune", "--hf-config", str(_fixture("qwen3-30b-a3b")), "--ep", "4", "--buckets", "1,64"]
    result = invoke(*args, "--backend", "xla", "--dry-run", "--json", "--db", sqlite_url)
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    labels = [row["label"] for row in plan["problems"]]
    assert labels == [f"qwen3-moe-ep4 {part} T={t}" for t in (1, 64) for part in ("gate_up", "down")]
    keys = [row["problem_key"] for row in plan["problems"]]
    expected = load_hf_config(_fixture("qwen3-30b-a3b"), ep=4).with_buckets((1, 64)).problems()
    assert keys == [p.problem.key for p in expected]
    assert all(p.problem.g == 32 for p in expected)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--hf-config", "{missing}"], "missing.json: No such file"),
        (["--hf-config", "{bad}"], "not JSON"),
        (["--hf-config", "{qwen3}", "--tp", "5"], "ffn=768 is not divisible by tp=5"),
        (["--hf-config", "{qwen3}", "--ep", "3"], "experts=128 is not divisible by ep=3"),
        (["--hf-config", "{unknown}"], "model_type 'bert' is not supported"),
        (["--model", "tiny", "--ep", "2"], "--tp and --ep shard an --hf-config model; give one"),
    ],
)
def test_tune_refuses_bad_configs_with_one_line_and_writes_nothing(tmp_path, args, message):
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "unknown.json").write_text('{"model_type": "bert"}')
    paths = {
        "missing": tmp_path / "missing.json",
        "bad": tmp_path / "bad.json",
        "unknown": tmp_path / "unknown.json",
        "qwen3": _fixture("qwen3-30b-a3b"),
    }
    db = tmp_path / "sweeps.db"
    args = [arg.format(**paths) for arg in args]
    result = invoke("tune", *args, "--backend", "xla", "--inline", "--db", f"sqlite:///{db}")
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.output
    assert not db.exists()
