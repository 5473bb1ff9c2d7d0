"""lab/baselines/entries.py on synthetic benchmark outputs: what each result file becomes."""

from __future__ import annotations

import json

import pytest

from moetune_lab.baselines import cli as baselines
from moetune_lab.baselines import entries, quotes, tables
from moetune_lab.bench import bench_block, dev_shapes


def test_a_command_is_written_as_anyone_would_type_it_from_the_repository_root():
    command = "python3 bench_gemm.py --projs gate_up --out '/data/run 7/out.json' --pack /opt/x/p.json"
    assert entries.portable_command(command) == (
        "python3 lab/bench/bench_gemm.py --projs gate_up --out $OUT/out.json --pack $OUT/p.json"
    )
    assert entries.portable_command("moetune tune --routing 'a b'") == "moetune tune --routing 'a b'"
    assert entries.portable_command("python3 nonexistent.py") == "python3 nonexistent.py"


def test_samples_are_rounded_to_the_timers_resolution_and_the_median_follows():
    assert entries.measurement([0.1234564, 0.2000001, 0.15], 6) == {
        "samples": [0.123456, 0.2, 0.15],
        "median": 0.15,
    }
    assert entries.measurement([1.000001, 2.000002], 6)["median"] == 1.5000015  # one decimal more


def test_versions_read_from_nvidia_smi_and_a_device_runtime():
    assert entries.driver_version("NVIDIA H200, 580.159.04, 345 MHz\nNVIDIA H200, 580.159.04") == "580.159.04"
    assert entries.driver_version("unavailable: no nvidia-smi") is None
    assert entries.driver_version("") is None
    assert entries.cuda_version("cuda 13000") == "13.0"
    assert entries.cuda_version("cuda 12080") == "12.8"
    assert entries.cuda_version("") is None


def bench_model_run() -> dict:
    def path(prefill_s, decode_s, layer_s):
        return {
            "prefill": {"samples_s": [prefill_s, prefill_s * 1.1, prefill_s * 0.9]},
            "decode": {"samples_s": [decode_s]},
            "moe": [{"tokens": 64, "reps": 5, "samples_s": [layer_s, layer_s]}],
        }

    return {
        "command": "python3 -m moetune_lab.model --model tiny --out /data/out/model.json",
        "date": "2026-01-02T03:04:05Z",
        "batch": 2,
        "prompt": 32,
        "gen": 4,
        "model": {"name": "tiny", "layers": 2},
        "device": {"device_kind": "Test GPU", "driver": "580.1", "runtime": "cuda 13000"},
        "versions": {"jax": "0.11.2", "jaxlib": "0.11.2", "python": "3.12.3"},
        "results": {
            "moetune": path(0.01, 0.02, 0.001),
            "ragged": path(0.04, 0.08, 0.004),
            "dense": path(0.02, 0.1, 0.002),
        },
    }


def test_a_model_run_becomes_prefill_decode_and_layer_entries_with_the_other_paths_as_peers():
    made = entries.model_entries(bench_model_run())
    assert [e["name"] for e in made] == [
        "bench_model/tiny/prefill",
        "bench_model/tiny/decode",
        "bench_model/tiny/moe_layer/T=64",
    ]
    prefill, decode, layer = made
    assert (
        prefill["params"]["tokens"] == 64 and decode["params"]["tokens"] == 8
    )  # batch * prompt, batch * gen
    assert prefill["median"] == 0.01 and sorted(prefill["peers"]) == ["dense", "ragged"]
    assert layer["peers"]["ragged"] == {"samples": [0.004, 0.004], "median": 0.004}
    assert prefill["versions"] == {
        "jax": "0.11.2",
        "jaxlib": "0.11.2",
        "cuda": "13.0",
        "driver": "580.1",
        "python": "3.12.3",
    }
    assert prefill["command"] == "python3 -m moetune_lab.model --model tiny --out $OUT/model.json"
    file = {"schema": "moetune.baselines", "schema_version": 1, "gpu": "Test GPU", "entries": made}
    assert baselines.problems_of(file) == []


def test_an_fp8_model_run_measures_its_fp8_path_under_names_of_its_own():
    run = bench_model_run() | {"fp8": "row_channel"}
    run["results"]["moetune_fp8"] = run["results"]["moetune"] | {"decode": {"samples_s": [0.01]}}
    run["results"]["moetune_fp8"]["decode"]["roofline_tokens_per_s"] = 1000.0
    run["read_GBps"] = 4400.04
    made = entries.model_entries(run)
    assert [e["name"] for e in made] == [
        "bench_model/tiny/fp8_row_channel/prefill",
        "bench_model/tiny/fp8_row_channel/decode",
        "bench_model/tiny/fp8_row_channel/moe_layer/T=64",
    ]
    decode = made[1]
    assert decode["median"] == 0.01 and sorted(decode["peers"]) == ["dense", "moetune", "ragged"]
    assert decode["params"]["path"] == "moetune_fp8" and decode["params"]["fp8"] == "row_channel"
    assert (
        decode["bounds"] == {"hbm_roofline_tokens_per_s": 1000.0} and decode["params"]["read_GBps"] == 4400.0
    )
    bf16 = entries.model_entries(bench_model_run())  # the bf16 run's names are apart: nothing replaced
    assert not {e["name"] for e in bf16} & {e["name"] for e in made}


def test_a_failed_path_of_a_model_run_is_no_peer_where_it_has_no_time():
    run = bench_model_run()
    run["results"]["moetune_fused"] = {"moe_block": {}, "error": "RuntimeError: out of memory"}
    run["results"]["moetune_fp8"] = {k: v for k, v in run["results"]["moetune"].items() if k != "moe"}
    run["results"]["moetune_fp8"]["error"] = "RuntimeError: cut in the MoE layer"
    prefill, decode, layer = entries.model_entries(run)
    assert sorted(prefill["peers"]) == sorted(decode["peers"]) == ["dense", "moetune_fp8", "ragged"]
    assert sorted(layer["peers"]) == ["dense", "ragged"]


def test_tuner_runs_of_either_kind_become_one_entry_with_a_sample_per_run():
    info = {
        "date": "2026-01-02",
        "versions": {"jax": "0.11.2", "jaxlib": "0.11.2"},
        "command": "c",
        "gpu": "G",
    }
    bench = {"problems": 4, "ray": {"per_minute": 270.2, "workers": 14}, "sequential": {"per_minute": 17.8}}
    made = entries.tuner_entry([bench], **info)
    assert (made["name"], made["unit"], made["samples"]) == (
        "tuner/ray_vs_sequential",
        "variants/min",
        [270.2],
    )
    assert made["peers"] == {"sequential": {"samples": [17.8], "median": 17.8}}
    runs = [
        {
            "base_per_minute": 200.0,
            "other_per_minute": 420.0,
            "winners_agree": 29,
            "problems": {"a": {}, "b": {}},
        },
        {
            "base_per_minute": 210.0,
            "other_per_minute": 380.0,
            "winners_agree": 30,
            "problems": {"a": {}, "b": {}},
        },
    ]
    made = entries.tuner_entry(runs, **info)
    assert made["samples"] == [420.0, 380.0] and made["median"] == 400.0
    assert made["peers"]["one_gpu"]["median"] == 205.0
    assert made["params"] == {"problems": 2, "winners_agree": [29, 30]}
    with pytest.raises(ValueError, match="moetune bench tuner --out"):
        entries.tuner_entry([bench, runs[0]], **info)
    timeline = {"trials": 480, "span_s": 111.7, "per_minute": 257.8, "workers": 14, "problems": 30}
    made = entries.tuner_entry([timeline], **info)
    assert (made["name"], made["unit"], made["samples"], made["peers"]) == (
        "tuner/sweep/30_problems",
        "trials/min",
        [257.8],
        {},
    )
    assert made["params"] == {"problems": 30, "workers": 14, "trials": [480], "span_s": [111.7]}


def finegrained_run() -> dict:
    def timed(ms, **extra):
        return {"samples_ms": [ms, ms * 1.02, ms * 0.98], "median_ms": ms, **extra}

    problem = {"op": "grouped_matmul_swiglu", "m": 8, "k": 2048, "n": 1536, "g": 128}
    case = {"model": "qwen3-30b-a3b", "gemm": "gate_up", "tokens": 1, "problem": problem, "routings": 4}
    case |= {"touched_experts": 8, "hbm_roofline_ms": 0.011}
    good = case | {
        "case": "qwen3-30b-a3b/gate_up/T1",
        "methods": {
            "moetune_heuristic": timed(0.024, config={"block_m": 8}),
            "moetune_alt1": timed(0.030),
            "moetune_alt2": timed(0.022),
            "moetune_pack": timed(0.020, config={"block_m": 16}),
            "torch_grouped_mm": timed(0.028),
            "cublas_torch": timed(0.005),
            "tokamax_mosaic": {"error": "ValueError: no config"},
        },
    }
    failed = case | {"case": "qwen3-30b-a3b/gate_up/T16", "tokens": 16, "methods": {"moetune_heuristic": {}}}
    env = {"date": "2026-01-02T03:04:05Z", "device_kind": "Test GPU", "jax": "0.11.2", "jaxlib": "0.11.2"}
    env["command"] = "python3 bench_gemm.py --models qwen3-30b-a3b --out /data/run/dev.json"
    return {"environment": env, "bandwidth": {"read_GBps": 4598.4}, "cases": [good, failed]}


def test_a_finegrained_run_keeps_the_heuristic_the_fastest_alternative_and_the_peers_that_ran():
    (made,) = entries.finegrained_entries(finegrained_run())  # the case without a heuristic time is left out
    assert made["name"] == "finegrained/qwen3-30b-a3b/gate_up/T=1"
    assert made["median"] == 0.024 and made["config"] == {"block_m": 8}
    assert sorted(made["peers"]) == [
        "cublas_torch",
        "moetune_alternative",
        "moetune_tuned",
        "torch_grouped_mm",
    ]
    assert made["peers"]["moetune_alternative"]["median"] == 0.022  # alt2, the faster alternative
    assert made["peers"]["moetune_tuned"]["median"] == 0.020 and made["params"]["tuned_config"] == {
        "block_m": 16
    }
    assert made["params"] | {"g": 128, "m": 8, "op": "grouped_matmul_swiglu"} == made["params"]
    assert made["command"] == "python3 lab/bench/bench_gemm.py --models qwen3-30b-a3b --out $OUT/dev.json"
    file = {"schema": "moetune.baselines", "schema_version": 1, "gpu": "Test GPU", "entries": [made]}
    assert baselines.problems_of(file) == []
    text = tables.render_full(file)
    # The heuristic over the tuned winner (0.024 / 0.020); the faster peer (torch, 0.028) over the best
    # (the tuned 0.020) and over the heuristic; cuBLAS (0.005) and the roofline (0.011) over the best.
    row = "| qwen3-30b-a3b | gate_up | 1 | 128 | 0.024 | 0.020 | 0.020 | 0.028 | not run | - | 0.005 | 1.20x"
    assert row + " | 1.40x | 1.17x | 25% | 55% |" in text
    # tokamax failed and says why; XLA was not tried: "-" and no line.
    assert made["failed_peers"] == {"tokamax_mosaic": "ValueError: no config"}
    assert (
        "- `finegrained/qwen3-30b-a3b/gate_up/T=1`, tokamax ragged_dot (mosaic): ValueError: no config"
        in text
    )


def backward_run() -> dict:
    def timed(ms, **extra):
        return {"samples_ms": [ms, ms * 1.01, ms * 0.99], "median_ms": ms, **extra}

    good = {
        "case": "mixtral-8x7b/down/T4096", "m": 8192, "k": 14336, "n": 4096, "g": 8,
        "methods": {
            "xla_ragged_dot": timed(10.5),
            "torch_grouped_mm": timed(1.41, timing="cupti"),
            "moetune_heuristic": timed(1.45, config={"block_m": 64}),
            "moetune_ranked2": timed(1.44),
            "moetune_ranked3": {"error": "ResourceExceeded"},
            "moetune_half_full": {"exact": timed(0.73), "buffer_2x": timed(0.74), "buffer_over_exact": 1.01},
            "moetune_dlhs": {
                "dlhs": timed(1.52, config={"block_m": 128}), "forward": timed(1.50),
                "dlhs_over_forward": 1.01,
            },
        },
    }  # fmt: skip
    skipped = {"case": "deepseek-v3/gate_up/T4096", "m": 32768, "k": 7168, "n": 4096, "g": 256}
    skipped["methods"] = {"xla_ragged_dot": {"skipped": "too large"}, "moetune_heuristic": {"error": "OOM"}}
    env = {"date": "2026-01-02T03:04:05Z", "device_kind": "Test GPU", "jax": "0.11.2", "jaxlib": "0.11.2"}
    env["command"] = "python3 bench_backward.py --out /data/run/drhs.json"
    return {"environment": env, "cases": [good, skipped, {"case": "x/y/T1", "error": "failed"}]}


def test_a_backward_run_keeps_the_heuristic_its_peers_and_the_half_full_pair():
    made, _ = entries.backward_entries(backward_run())  # cases without a heuristic time are left out
    assert made["name"] == "backward/drhs/mixtral-8x7b/down/T=4096" and made["suite"] == "backward"
    assert made["median"] == 1.45 and made["config"] == {"block_m": 64}
    assert sorted(made["peers"]) == [
        "moetune_alternative", "moetune_half_tokens_buffer_2x", "moetune_half_tokens_exact",
        "torch_grouped_mm", "xla_ragged_dot",
    ]  # fmt: skip
    assert made["params"] == {
        "model": "mixtral-8x7b", "gemm": "down", "tokens": 4096, "op": "grouped_matmul_drhs",
        "m": 8192, "k": 14336, "n": 4096, "g": 8,
    }  # fmt: skip
    assert made["command"] == "python3 lab/bench/bench_backward.py --out $OUT/drhs.json"
    file = {"schema": "moetune.baselines", "schema_version": 1, "gpu": "Test GPU", "entries": [made]}
    assert baselines.problems_of(file) == []


def test_a_backward_run_with_dlhs_keeps_the_input_gradient_beside_the_forward_op_of_its_shape():
    _, made = entries.backward_entries(backward_run())
    assert made["name"] == "backward/dlhs/mixtral-8x7b/down/T=4096" and made["suite"] == "backward"
    assert made["median"] == 1.52 and made["config"] == {"block_m": 128}
    assert made["peers"] == {"moetune_forward": {"samples": [1.5, 1.515, 1.485], "median": 1.5}}
    # dout @ rhs[g]^T: the weight gradient's k and n swapped.
    assert made["params"] == {
        "model": "mixtral-8x7b", "gemm": "down", "tokens": 4096, "op": "grouped_matmul",
        "m": 8192, "k": 4096, "n": 14336, "g": 8,
    }  # fmt: skip
    file = {"schema": "moetune.baselines", "schema_version": 1, "gpu": "Test GPU", "entries": [made]}
    assert baselines.problems_of(file) == []


def test_a_backward_config_run_keeps_each_given_config_named_by_what_it_changed():
    run = backward_run()
    methods = run["cases"][0]["methods"]
    methods["moetune_config1"] = {"samples_ms": [2.0, 2.2, 2.1], "config": {"block_m": 64, "block_n": 256}}
    methods["moetune_config2"] = {"error": "ResourceExceeded: smem_fits"}  # a config that could not run
    (made,) = entries.backward_config_entries(run)
    assert made["name"] == "backward/drhs_config/mixtral-8x7b/down/T=4096/block_n=256"
    assert made["median"] == 2.1 and made["config"] == {"block_m": 64, "block_n": 256}
    assert sorted(made["peers"]) == ["moetune_heuristic", "torch_grouped_mm"]
    assert made["peers"]["moetune_heuristic"]["median"] == 1.45
    file = {"schema": "moetune.baselines", "schema_version": 1, "gpu": "Test GPU", "entries": [made]}
    assert baselines.problems_of(file) == []
    assert entries.backward_config_entries(backward_run()) == []  # a run of the heuristic alone


def test_a_layer_run_keeps_the_moetune_step_and_the_peers_that_ran():
    def timed(ms):
        return {"samples_ms": [ms, ms * 1.02, ms * 0.98], "median_ms": ms}

    env = {"date": "2026-01-02T03:04:05Z", "device_kind": "Test GPU", "jax": "0.11.2", "jaxlib": "0.11.2"}
    env["command"] = "python3 bench_layer_grad.py --out /data/run/layer.json"
    good = {"model": "qwen3-30b-a3b", "tokens": 4096, "gemm_flops": 10**12}
    good["methods"] = {"moetune": timed(4.0), "xla": {"error": "OOM"}, "torch_grouped_mm": timed(4.4)}
    failed = {"model": "mixtral-8x7b", "tokens": 4096, "gemm_flops": 10**13, "methods": {"moetune": {}}}
    (made,) = entries.layer_entries({"environment": env, "cases": [good, failed]})
    assert made["name"] == "layer_grad/qwen3-30b-a3b/T=4096" and made["suite"] == "layer_grad"
    assert made["median"] == 4.0 and sorted(made["peers"]) == ["torch_grouped_mm"]
    assert made["params"] == {"model": "qwen3-30b-a3b", "tokens": 4096, "gemm_flops": 10**12}
    assert made["command"] == "python3 lab/bench/bench_layer_grad.py --out $OUT/layer.json"
    file = {"schema": "moetune.baselines", "schema_version": 1, "gpu": "Test GPU", "entries": [made]}
    assert baselines.problems_of(file) == []


def example_run(backend: str, step_times: list[float], losses: list[float]) -> dict:
    """An examples/train_moe.py --json output."""
    config = {"vocab": 256, "dim": 512, "heads": 8, "layers": 2, "experts": 8, "top_k": 2, "ffn": 1024}
    config |= {"seq": 512, "batch": 64, "lr": 3e-3, "weight_decay": 0.01, "steps": len(losses)}
    config |= {"log_every": 50, "seed": 0, "moe_dtype": "bfloat16"}
    return {
        "backend": backend,
        "config": config,
        "losses": losses,
        "first_step_s": 12.5,
        "step_times_s": step_times,
        "step_s": sorted(step_times)[len(step_times) // 2] if step_times else 12.5,
        "tokens_per_s": 1.0,
        "date": "2026-01-02T03:04:05Z",
        "command": f"python3 examples/train_moe.py --backend {backend} --steps 4 --json",
        "device": {"device_kind": "Test GPU", "driver": "580.1", "runtime": "cuda 13000"},
        "versions": {
            "python": "3.12.3",
            "jax": "0.11.2",
            "jaxlib": "0.11.2",
            "optax": "0.2.8",
            "moetune": "0.1",
        },
    }


def example_pair(**xla_config) -> list[dict]:
    auto = example_run("auto", [0.0201234561, 0.0199, 0.0203], [5.5, 4.0, 2.25, 1.0])
    xla = example_run("xla", [0.031, 0.0305, 0.0312], [5.5, 4.0625, 2.125, 1.03125])
    xla["config"] |= xla_config
    return [xla, auto]  # in either order


def test_an_example_pair_becomes_one_entry_with_moetunes_step_times_and_xlas_as_the_peer():
    made = entries.example_entry(example_pair(log_every=10))  # log_every changes no measurement
    assert made["name"] == (
        "train_example/layers=2,dim=512,heads=8,experts=8,top_k=2,ffn=1024,vocab=256/batch=64,seq=512,bfloat16"
    )
    assert (made["suite"], made["unit"], made["gpu"], made["date"]) == (
        "train_example", "s", "Test GPU", "2026-01-02T03:04:05Z"
    )  # fmt: skip
    assert made["samples"] == [0.020123456, 0.0199, 0.0203] and made["median"] == 0.020123456
    assert made["peers"] == {"xla": {"samples": [0.031, 0.0305, 0.0312], "median": 0.031}}
    assert made["params"] == {
        "batch": 64, "seq": 512, "steps": 4, "layers": 2, "dim": 512, "heads": 8, "experts": 8, "top_k": 2,
        "ffn": 1024, "vocab": 256, "moe_dtype": "bfloat16", "tokens": 64 * 512, "final_loss": 1.0,
        "xla_final_loss": 1.03125,
        "max_abs_loss_diff": 0.125,  # step 2: 2.25 against 2.125; the last step differs by 0.03125
    }  # fmt: skip
    assert made["versions"] == {
        "jax": "0.11.2", "jaxlib": "0.11.2", "cuda": "13.0", "driver": "580.1", "python": "3.12.3",
        "moetune": "0.1", "optax": "0.2.8",
    }  # fmt: skip
    assert made["command"] == (
        "python3 examples/train_moe.py --backend auto --steps 4 --json"
        " && python3 examples/train_moe.py --backend xla --steps 4 --json"
    )
    file = {"schema": "moetune.baselines", "schema_version": 1, "gpu": "Test GPU", "entries": [made]}
    assert baselines.problems_of(file) == []


def test_an_example_pair_must_be_one_auto_and_one_xla_run_of_one_config_with_timed_steps():
    xla, auto = example_pair()
    with pytest.raises(
        ValueError, match="needs one --backend auto and one --backend xla run, not: auto, auto"
    ):
        entries.example_entry([auto, auto])
    with pytest.raises(ValueError, match="different configs: batch=64 vs 32, seed=0 vs 1"):
        entries.example_entry(example_pair(batch=32, seed=1))
    other_gpu = xla | {"device": xla["device"] | {"device_kind": "Other GPU"}}
    with pytest.raises(ValueError, match="the xla run on 'Other GPU'"):
        entries.example_entry([auto, other_gpu])
    one_step = [example_run(b, [], [5.5]) for b in ("auto", "xla")]
    with pytest.raises(ValueError, match="the auto run of --steps 1 has no step after the compiling one"):
        entries.example_entry(one_step)


def test_add_example_upserts_the_entry_into_a_baselines_file(tmp_path, capsys):
    paths = []
    for run in example_pair():
        paths.append(tmp_path / f"train_{run['backend']}.json")
        paths[-1].write_text(json.dumps(run))
    target = tmp_path / "test_gpu.json"
    for _ in range(2):  # the second time replaces the entry
        assert baselines.main(["add-example", *map(str, paths), "--file", str(target)]) == 0
    written = json.loads(target.read_text())
    assert baselines.problems_of(written) == []
    (added,) = written["entries"]
    assert added["suite"] == "train_example" and added["peers"]["xla"]["median"] == 0.031
    capsys.readouterr()
    assert baselines.main(["add-example", str(paths[0]), str(paths[0]), "--file", str(target)]) == 2
    assert capsys.readouterr().err.startswith("error: add-example: needs one --backend auto")


def test_a_block_run_keeps_the_peers_that_ran_and_the_stages():
    def timed(ms):
        return {"samples_ms": [ms, ms * 1.02, ms * 0.98], "median_ms": ms}

    # Cases as bench_block.py itself writes them, so that the two cannot drift apart.
    block = bench_block
    model = dev_shapes.MODELS["qwen3-30b-a3b"]
    stages = {
        name: timed(ms)
        for name, ms in zip(("route", "permute", "gate_up", "down", "combine"), (1, 2, 3, 4, 5), strict=True)
    }
    methods = {
        "moetune": timed(0.05),
        "tokamax": timed(0.06),
        "torch_grouped_mm": timed(0.1),
        "xla": {"error": "skipped"},
    }
    good = block.case_record(model, 1, methods, stages)
    cut = block.skipped_record(model, 128, "budget spent")
    env = {"date": "2026-01-02T03:04:05Z", "device_kind": "Test GPU", "jax": "0.11.2", "jaxlib": "0.11.2"}
    env["command"] = "python3 bench_block.py --out /data/block.json"
    (made,) = entries.block_entries({"environment": env, "cases": [good, cut]})
    assert made["name"] == "moe_block/qwen3-30b-a3b/T=1" and made["median"] == 0.05
    assert sorted(made["peers"]) == ["tokamax", "torch_grouped_mm"]
    assert made["params"]["stages_ms"] == {"route": 1, "permute": 2, "gate_up": 3, "down": 4, "combine": 5}
    file = {"schema": "moetune.baselines", "schema_version": 1, "gpu": "Test GPU", "entries": [made]}
    assert baselines.problems_of(file) == []
    text = tables.render_full(file)
    row = "| qwen3-30b-a3b | 1 | 128 | 0.050 | 0.060 | 0.100 | - | 1.20x |"
    assert row + " 1.000 | 2.000 | 3.000 | 4.000 | 5.000 |" in text
    assert "fused decode block" not in text  # no column of dashes for forms the run did not time


def test_a_block_run_of_every_method_renders_moetunes_unfused_and_fused_forms_as_columns():
    def timed(ms):
        return {"samples_ms": [ms, ms], "median_ms": ms}

    model = dev_shapes.MODELS["qwen3-30b-a3b"]
    every = {"moetune": timed(0.05), "moetune_unfused": timed(0.07), "moetune_fused": timed(0.04)}
    every |= {"tokamax": timed(0.06), "xla": timed(0.2), "torch_grouped_mm": timed(0.1)}
    assert set(every) == set(bench_block.METHODS)
    past_the_block = every | {"moetune_fused": {"skipped": "the fused block does not run: T=4096"}}
    cases = [
        bench_block.case_record(model, 1, every, {}),
        bench_block.case_record(model, 4096, past_the_block, {}),
    ]
    env = {"date": "2026-01-02T03:04:05Z", "device_kind": "Test GPU", "command": "python3 bench_block.py"}
    made = entries.block_entries({"environment": env, "cases": cases})
    assert sorted(made[0]["peers"]) == sorted(set(bench_block.METHODS) - {"moetune"})
    text = tables.render_full(
        {"schema": "moetune.baselines", "schema_version": 1, "gpu": "G", "entries": made}
    )
    head = (
        "| model | T | E | moetune | moetune, unfused | moetune, fused decode block | on tokamax ragged_dot |"
    )
    assert head in text
    assert "| qwen3-30b-a3b | 1 | 128 | 0.050 | 0.070 | 0.040 | 0.060 | 0.100 | 0.200 | 1.20x |" in text
    assert "| qwen3-30b-a3b | 4096 | 128 | 0.050 | 0.070 | - | 0.060 | 0.100 | 0.200 | 1.20x |" in text


def test_a_block_run_keeps_each_methods_kernel_count_and_the_roofline_its_shares_are_quoted_against():
    model = dev_shapes.MODELS["qwen3-30b-a3b"]
    methods = {
        "moetune": {"samples_ms": [0.05, 0.05], "median_ms": 0.05, "kernels": 14},
        "moetune_fused": {
            "samples_ms": [0.04, 0.04], "median_ms": 0.04, "kernels": 2,
            "kernel_names": ["moetune_decode_up", "moetune_decode_down"], "kernel_ms": [0.025, 0.015],
            "block": {"fused": True, "config": {"block_f": 64}, "source": "heuristic", "reason": "r"},
        },
    }  # fmt: skip
    case = bench_block.case_record(model, 1, methods, {}, roofline_ms=0.02)
    env = {"date": "2026-01-02T03:04:05Z", "device_kind": "Test GPU", "command": "python3 bench_block.py"}
    (made,) = entries.block_entries({"environment": env, "cases": [case]})
    assert made["params"]["kernels"] == {"moetune": 14, "moetune_fused": 2}
    # Where the fused block's time goes, kernel by kernel (a run without per-kernel times records none).
    assert made["params"]["kernel_ms"] == {
        "moetune_fused": [["moetune_decode_up", 0.025], ["moetune_decode_down", 0.015]]
    }
    assert made["bounds"] == {"hbm_roofline": 0.02}
    assert quotes.value(made, "roof:moetune_fused") == pytest.approx(0.5)
    # Which config the fused block ran, and from where: the row can be rerun and modelled.
    assert made["params"]["block"] == {"moetune_fused": methods["moetune_fused"]["block"]}


def _timed(ms, **extra):
    return {"samples_ms": [ms, ms * 1.02, ms * 0.98], "median_ms": ms} | extra


def _fp8_run(methods: dict) -> dict:
    """A bench_fp8.py --out file of one DeepSeek-V3 gate_up case at T=4096 with these methods."""
    case = {"case": "deepseek-v3/gate_up/T4096", "model": "deepseek-v3", "gemm": "gate_up", "tokens": 4096,
            "routings": 1, "touched_experts": 256, "flops": 2.0e12, "hbm_roofline_fp8_ms": 0.8,
            "methods": methods}  # fmt: skip
    env = {"date": "2026-01-02T03:04:05Z", "device_kind": "Test GPU", "jax": "0.11.2", "jaxlib": "0.11.2"}
    env["command"] = "python3 bench_fp8.py --out /data/fp8.json"
    return {"environment": env, "bandwidth": {"read_GBps": 4700.0}, "cases": [case]}


def test_an_fp8_run_keeps_the_heuristic_per_layout_the_fastest_alternative_and_the_peers():
    config = {"block_m": 64, "block_n": 128}
    methods = {
        "moetune_fp8_row_channel_heuristic": _timed(2.0, config=config),
        "moetune_fp8_row_channel_alt1": _timed(1.6, config=config | {"block_m": 128}),
        "moetune_fp8_row_channel_alt2": _timed(1.8, config=config),
        "moetune_fp8_block_1x128_128x128_heuristic": {"error": "skipped: budget spent"},
        "torch_scaled_grouped_mm": _timed(3.2),
        "moetune_bf16": _timed(4.0),
        "cublas_fp8": {"error": "RuntimeError: boom"},
    }
    run = _fp8_run(methods)
    (made,) = entries.fp8_entries(run | {"layouts": ["row_channel", "block_1x128_128x128"]})
    assert made["name"] == "fp8/deepseek-v3/gate_up/T=4096/row_channel" and made["median"] == 2.0
    assert sorted(made["peers"]) == ["moetune_alternative", "moetune_bf16", "torch_scaled_grouped_mm"]
    assert made["failed_peers"] == {"cublas_fp8": "RuntimeError: boom"}  # moetune's own failures are not
    assert made["peers"]["moetune_alternative"]["median"] == 1.6
    assert made["params"]["alternative_config"]["block_m"] == 128 and made["bounds"]["hbm_roofline"] == 0.8
    file = {"schema": "moetune.baselines", "schema_version": 1, "gpu": "Test GPU", "entries": [made]}
    assert baselines.problems_of(file) == []
    text = tables.render_full(file)
    # best 1.6 ms: 2e12 FLOP -> 1250 TF/s; torch FP8 3.2 / 1.6, bf16 4.0 / 1.6; roofline 0.8 / 1.6.
    row = "| deepseek-v3 | gate_up | 4096 | row_channel | 2.0000 | 1.6000 | 1250 | 2.00x | 2.50x | - |"
    assert row + " not run | 50% |" in text


def test_an_fp8_block_run_keeps_the_one_block_steps_variant_as_a_peer():
    config = {"block_m": 64, "block_n": 64, "block_k": 256}
    methods = {
        "moetune_fp8_block_1x128_128x128_heuristic": _timed(8.8, config=config),
        "moetune_fp8_block_1x128_128x128_one_block_steps": _timed(10.5, config=config | {"block_k": 128}),
        "torch_grouped_mm": _timed(14.0),
    }
    (made,) = entries.fp8_entries(_fp8_run(methods) | {"layouts": ["block_1x128_128x128"]})
    assert sorted(made["peers"]) == ["moetune_one_block_steps", "torch_grouped_mm"]
    assert made["peers"]["moetune_one_block_steps"]["median"] == 10.5
    assert made["params"]["one_block_steps_config"]["block_k"] == 128 and made["median"] == 8.8


def test_the_block_tiles_on_per_channel_data_are_a_peer_of_the_block_entry_only():
    config = {"block_m": 64, "block_n": 128, "block_k": 256}
    methods = {
        "moetune_fp8_row_channel_heuristic": _timed(0.7, config=config | {"block_m": 128}),
        "moetune_fp8_block_1x128_128x128_heuristic": _timed(1.13, config=config),
        "block_tiles_per_channel": _timed(0.89, config=config),
        "torch_grouped_mm": _timed(1.3),
    }
    run = _fp8_run(methods) | {"layouts": ["row_channel", "block_1x128_128x128"]}
    channel, block = entries.fp8_entries(run)
    assert sorted(channel["peers"]) == ["torch_grouped_mm"] and channel["median"] == 0.7
    assert sorted(block["peers"]) == ["moetune_same_tiles_row_channel", "torch_grouped_mm"]
    assert block["peers"]["moetune_same_tiles_row_channel"]["median"] == 0.89


def test_a_maxtext_run_keeps_each_timed_case_with_maxtexts_route_as_the_peer():
    def timed(ms):
        return {"samples_ms": [ms, ms * 1.02, ms * 0.98], "median_ms": ms}

    env = {"date": "2026-01-02T03:04:05Z", "device_kind": "Test GPU", "jax": "0.11.2", "jaxlib": "0.11.2"}
    yml = "/opt/venv/lib/python3.12/site-packages/maxtext/configs/gpu/models/mixtral_8x7b.yml"
    env["command"] = f"python3 bench_maxtext.py --out /data/run/serve.json -- {yml} per_device_batch_size=1"
    decode = {"name": "serve/decode", "tokens": 1, "rel_err": 1.234567e-3}
    decode["methods"] = {"moetune": timed(10.0), "maxtext": timed(50.0)}
    mismatched = {"name": "step/train", "tokens": 4096, "rel_err": 0.7, "parity_failed": "differs by 0.7"}
    mismatched["methods"] = {"moetune": timed(100.0), "maxtext": timed(150.0)}
    failed = {"name": "layer/train/forward+backward", "tokens": 4096, "methods": {}, "error": "OOM"}
    run = {"environment": env, "config": [yml, "per_device_batch_size=1"], "model_name": "mixtral-8x7b"}
    run |= {"layers": 16, "route": "ragged_dot", "records": [decode, failed, mismatched]}
    made, timed_anyway = entries.maxtext_entries(run)
    assert made["name"] == "maxtext/mixtral-8x7b/serve/decode/T=1/ragged_dot" and made["suite"] == "maxtext"
    assert made["median"] == 10.0 and made["peers"]["maxtext_ragged_dot"]["median"] == 50.0
    assert made["params"] == {
        "model": "mixtral-8x7b", "case": "serve/decode", "tokens": 1, "layers": 16, "route": "ragged_dot",
        "rel_err": 0.00123,
    }  # fmt: skip
    assert made["command"] == (
        "python3 lab/bench/bench_maxtext.py --out $OUT/serve.json -- "
        "maxtext/configs/gpu/models/mixtral_8x7b.yml per_device_batch_size=1"
    )
    assert timed_anyway["params"]["parity_failed"] == "differs by 0.7"
    file = {"schema": "moetune.baselines", "schema_version": 1, "gpu": "Test GPU", "entries": [made]}
    assert baselines.problems_of(file) == []


def test_an_fp8_block_run_keeps_the_staggered_variant_as_a_peer_with_its_config():
    config = {"block_m": 64, "block_n": 64, "block_k": 256, "wg_split": "n"}
    methods = {
        "moetune_fp8_block_1x128_128x128_heuristic": _timed(8.8, config=config),
        "moetune_fp8_block_1x128_128x128_staggered": _timed(7.9, config=config | {"stagger_consumers": True}),
    }
    (made,) = entries.fp8_entries(_fp8_run(methods) | {"layouts": ["block_1x128_128x128"]})
    assert sorted(made["peers"]) == ["moetune_staggered"] and made["median"] == 8.8
    assert made["params"]["staggered_config"]["stagger_consumers"] is True
