"""Tuning problems from a MaxText config: the trace of MaxText's own layer gives exactly the GEMMs a training
step of the model dispatches, per shard, with the rows its groups fill; bad input is one line."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.requires import require

require("maxtext", extra="maxtext")

from moetune.integrations.maxtext.problems import Target, planned_problems  # noqa: E402
from moetune.kernels.errors import ConfigInvalid  # noqa: E402
from moetune.tuner.spec import SweepSpec  # noqa: E402
from tests.integrations.maxtext import tiny_model  # noqa: E402


@pytest.fixture
def tiny_yml(tmp_path):
    """tiny_model's config as a MaxText YAML over MaxText's base.yml."""
    lines = [f"base_config: {tiny_model.base_yml()}"] + [f"{k}: {v}" for k, v in tiny_model.TINY.items()]
    path = tmp_path / "tiny.yml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _keys(items):
    return {(p.op, p.m, p.k, p.n, p.g, p.transpose_rhs) for p in items}


@pytest.mark.slow
def test_the_traced_problems_are_the_ones_a_training_step_dispatches(tiny_yml):
    planned = planned_problems(Target(str(tiny_yml), workloads=("train",)))
    ran = tiny_model.run(tiny_model.config(), moetune=True)["dispatched"]
    assert _keys(p.problem for p in planned) == _keys(e.problem for e in ran)
    # Forward, dlhs and drhs of both weights: six GEMMs. 2 sequences of 32 tokens, top-2: 128 of the 512
    # rows MaxText pads to its tile hold groups.
    assert len(planned) == 6
    assert {(p.tokens, p.filled_rows, p.problem.m) for p in planned} == {(64, 128, 512)}
    assert {p.label.split(" ", 3)[3] for p in planned} == {
        "wi forward", "wi dlhs", "wi drhs", "wo forward", "wo dlhs", "wo drhs"
    }  # fmt: skip


@pytest.mark.slow
def test_expert_and_tensor_parallel_shards_and_each_workloads_rows(tiny_yml):
    target = Target(str(tiny_yml), ("ici_expert_parallelism=2", "ici_tensor_parallelism=2"), devices=4)
    planned = planned_problems(target)
    # 8 experts over 2 expert shards, the ffn of 96 over 2 tensor ranks; tokens of a shard: the global
    # batch of 2 x 4 sequences over the 2 ranks that hold distinct tokens.
    assert {(p.problem.g, p.problem.k, p.problem.n) for p in planned if "wi forward" in p.label} == {
        (4, 64, 48)
    }
    rows = {p.label.split(" ")[1]: (p.tokens, p.filled_rows) for p in planned}
    assert rows == {"train": (128, 256), "prefill": (64, 128), "decode": (4, 8)}


@pytest.mark.slow
def test_a_decode_workload_plans_the_fused_blocks_problem_beside_maxtexts_gemms(tiny_yml):
    """What the plug-in looks up at a decode step (decode_mode 'auto'): the block's problem at the whole
    batch's tokens, which a sweep must time faster than MaxText's path for the block to run there."""
    planned = planned_problems(Target(str(tiny_yml), workloads=("decode",)))
    block = [p for p in planned if p.problem.op == "moe_decode_block"]
    labels = [(p.label.split(" ", 1)[1], p.tokens, p.filled_rows) for p in block]
    assert labels == [("decode T=2 block", 2, None)]
    assert block[0].problem.key == (
        "moe_decode_block/m=2,k=64,n=192,g=8,lhs=float32,rhs=float32,out=float32,t=0,top_k=2/v3"
    )
    gemms = {p.label.split(" ", 3)[3] for p in planned if p not in block}
    assert gemms == {"wi forward", "wo forward"}  # MaxText's path, where the block does not run


def test_bad_targets_are_one_line(tmp_path, tiny_yml):
    with pytest.raises(ConfigInvalid, match="not key=value"):
        Target(str(tiny_yml), ("num_experts",))
    with pytest.raises(ConfigInvalid, match="choose from train, prefill, decode"):
        Target(str(tiny_yml), workloads=("serve",))
    with pytest.raises(ConfigInvalid, match="devices=0"):
        Target(str(tiny_yml), devices=0)
    with pytest.raises(ConfigInvalid, match="not a file"):
        planned_problems(Target(str(tmp_path / "missing.yml")))


@pytest.mark.slow
def test_maxtexts_refusal_and_the_plugins_refusal_reach_the_caller_as_one_line(tiny_yml):
    with pytest.raises(ConfigInvalid) as refused:
        planned_problems(Target(str(tiny_yml), ("base_moe_mlp_dim=80",)))  # MaxText: mlp dims must match
    assert "base_moe_mlp_dim" in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(ConfigInvalid, match="sparse_matmul=False"):
        planned_problems(Target(str(tiny_yml), ("sparse_matmul=False",)))


def test_a_sweep_spec_keeps_its_maxtext_target(tiny_yml):
    spec = SweepSpec(maxtext={"config": str(tiny_yml), "overrides": ["ici_expert_parallelism=2"]})
    again = SweepSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec
    with pytest.raises(ConfigInvalid, match="maxtext: unknown fields"):
        SweepSpec(maxtext={"config": str(tiny_yml), "mesh": 8})


def test_a_queued_request_cannot_name_a_maxtext_config(tiny_yml):
    from moetune.tuner.queue_spec import from_request

    with pytest.raises(ConfigInvalid, match="cannot name a MaxText config"):
        from_request({"maxtext": {"config": str(tiny_yml)}}, "request")


def _tune(*args):
    import moetune.cli.tune  # noqa: F401 - registers the command
    from moetune.cli import app

    return CliRunner().invoke(app, ["tune", *args])


@pytest.mark.slow
def test_tune_plans_a_maxtext_config_with_its_overrides(tiny_yml):
    flags = [
        "--backend",
        "xla",
        "--dry-run",
        "--json",
        "--maxtext-workloads",
        "train",
        "--maxtext-devices",
        "2",
    ]
    result = _tune("--maxtext-config", str(tiny_yml), *flags, "ici_expert_parallelism=2")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    problems = plan["problems"]
    assert len(problems) == 6 and {p["kng"].split(",")[2] for p in problems} == {"4"}, problems
    assert {(p["m"], p["filled_rows"]) for p in problems} == {(512, 128)}


@pytest.mark.parametrize(
    "args, says",
    [
        (["num_experts=4"], "arguments go with --maxtext-config"),
        (
            ["--maxtext-devices", "2", "--problem", "m=8,k=8,n=8,g=2"],
            "--maxtext-devices go with --maxtext-config",
        ),
        (["--maxtext-config", "missing.yml"], "not a file"),
    ],
)
def test_tune_refuses_maxtext_flags_without_a_config_in_one_line(args, says):
    result = _tune(*args, "--dry-run")
    assert result.exit_code == 2 and says in result.output, result.output
