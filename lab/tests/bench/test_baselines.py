"""lab/baselines/cli.py: the baselines files' schema, adding measurements, and the pages rendered from
them. Only the committed files' validity and the committed pages' agreement with them are checked on
the real data; everything else runs on small synthetic baselines."""

from __future__ import annotations

import copy
import json

import pytest
from tests.bench.synthetic import MOSAIC_CONFIG

from moetune_lab.baselines import cli as baselines
from moetune_lab.baselines import tables


def entry(name="bench_gemm/gate_up/T=4/balanced", samples=(0.2, 0.1, 0.3), **fields) -> dict:
    base = {
        "name": name,
        "suite": "bench_gemm",
        "date": "2026-01-02T03:04:05Z",
        "gpu": "Test GPU",
        "versions": {"jax": "0.11.2", "jaxlib": "0.11.2"},
        "command": "python3 lab/bench/bench_gemm.py --out $OUT/a.json",
        "unit": "ms",
        "samples": list(samples),
        "median": sorted(samples)[len(samples) // 2],
        "params": {"proj": "gate_up", "tokens": 4, "m": 8, "k": 64, "n": 128, "g": 4, "routing": "balanced"},
        "peers": {
            "torch_grouped_mm": {"samples": [0.4, 0.5, 0.6], "median": 0.5},
            "mgpu_best": {"samples": [0.25], "median": 0.25},
            "xla_ragged_dot": {"samples": [1.0], "median": 1.0},
            "cublas_torch": {"samples": [0.08], "median": 0.08},
        },
        "bounds": {"hbm_roofline": 0.16},
        "config": MOSAIC_CONFIG,
        "from_pack": True,
    }
    return base | fields


def data(*entries) -> dict:
    return {"schema": "moetune.baselines", "schema_version": 1, "gpu": "Test GPU", "entries": list(entries)}


def test_the_committed_baselines_files_are_valid():
    files = baselines.gpu_files()  # the service's file has a schema of its own: test_service_baselines.py
    assert files, "no baselines file"
    for path in files:
        loaded = json.loads(path.read_text())
        assert baselines.problems_of(loaded) == [], path
        assert path.stem == baselines.gpu_key(loaded["gpu"])
        assert path.stat().st_size < 500_000  # small: raw samples of some 250 measurements, not a sweep


def test_the_committed_pages_are_what_render_makes_of_the_baselines():
    stale = baselines.render(baselines.PAGES, baselines.load_all(), check=True)
    assert stale == [], "run `python3 -m moetune_lab.baselines render`"


def test_a_valid_synthetic_file_has_no_problems():
    assert baselines.problems_of(data(entry())) == []


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda e: e.update(median=0.3), "median=0.3 is not the median of its samples (0.2)"),
        (lambda e: e.pop("command"), "missing command"),
        (lambda e: e.update(colour="blue"), "unknown field 'colour'"),
        (lambda e: e.update(unit="furlongs"), "unit='furlongs' is not one of"),
        (lambda e: e.update(date="yesterday"), "date='yesterday' is not an ISO 8601 date"),
        (lambda e: e.update(gpu="Other GPU"), "gpu='Other GPU' differs from the file's gpu='Test GPU'"),
        (lambda e: e.update(versions={"jax": "0.11.2"}), "versions must name at least jax and jaxlib"),
        (lambda e: e.update(samples=[0.1, -1.0, 0.2]), "every sample must be a positive number"),
        (lambda e: e.update(samples=[]), "samples must be a non-empty list"),
        (lambda e: e["params"].pop("routing"), "params lacks routing"),
        (
            lambda e: e["peers"]["mgpu_best"].update(median=9.0),
            "peers.mgpu_best: median=9.0 is not the median",
        ),
        (lambda e: e["peers"].update(cublas_torch={"median": 1.0}), "peers.cublas_torch must hold exactly"),
        (lambda e: e["bounds"].update(hbm_roofline=0), "bounds.hbm_roofline must be a positive number"),
        (lambda e: e.pop("config"), "needs bounds.hbm_roofline and the config it timed"),
        (lambda e: e.update(suite="lab"), "suite='lab' is not one of"),
        (lambda e: e.update(failed_peers={"dense": ""}), "failed_peers must map each peer"),
        (lambda e: e.update(failed_peers={"mgpu_best": "OOM"}), "failed_peers names a peer that ran"),
    ],
)
def test_each_schema_break_is_named(change, problem):
    broken = entry()
    change(broken)
    problems = baselines.problems_of(data(broken))
    assert any(problem in p for p in problems), problems


def test_file_level_breaks_are_named():
    assert baselines.problems_of([]) == ["the file is not a JSON object"]
    problems = baselines.problems_of(
        {"schema": "x", "schema_version": 2, "gpu": "", "extra": 1, "entries": {}}
    )
    assert problems == [
        "schema='x', expected 'moetune.baselines'",
        "schema_version=2, expected 1",
        "unknown field 'extra'",
        "gpu must be a non-empty string",
        "entries must be a list",
    ]
    assert baselines.problems_of(data(entry(), entry())) == [
        "the name 'bench_gemm/gate_up/T=4/balanced' is used more than once"
    ]


def test_adding_replaces_the_entry_of_the_same_name_and_keeps_the_rest(tmp_path):
    path = tmp_path / "test_gpu.json"
    path.write_text(baselines.dumps(data(entry(), entry(name="bench_gemm/down/T=4/balanced"))))
    newer = entry(samples=(0.09, 0.11, 0.1))
    added = baselines.add(path, [newer, entry(name="bench_gemm/gate_up/T=8/zipf")])
    assert [e["name"] for e in added["entries"]] == [
        "bench_gemm/gate_up/T=4/balanced",
        "bench_gemm/down/T=4/balanced",
        "bench_gemm/gate_up/T=8/zipf",
    ]
    assert added["entries"][0]["median"] == 0.1
    assert baselines.add(tmp_path / "new.json", [entry()]) == data(entry())
    with pytest.raises(ValueError, match="median="):
        baselines.add(path, [entry(median=7.0)])
    with pytest.raises(ValueError, match="one GPU model"):
        baselines.add(path, [entry(), entry(name="x", gpu="Other GPU")])


def test_the_file_text_keeps_each_measurement_on_one_line_and_round_trips():
    original = data(entry(samples=tuple(0.1 + i / 1000 for i in range(10))))
    text = baselines.dumps(original)
    assert json.loads(text) == original
    assert '"samples": [0.1, 0.101, 0.102' in text
    assert '"torch_grouped_mm": {"samples": [0.4, 0.5, 0.6], "median": 0.5}' in text
    assert '"config": {"block_m": 64, "block_n": 128' in text
    # A long run's samples (the training example's 299 step times) stay on one line too.
    long = data(entry(samples=tuple(round(0.020001 + i / 10**6, 6) for i in range(299))))
    text = baselines.dumps(long)
    assert json.loads(text) == long
    assert '   "samples": [0.020001, 0.020002, ' in text and len(text.splitlines()) < 40


PAGE = """# Page

Prose that render leaves alone: 1.234 ms.

<!-- baselines test_gpu full -->
stale text
<!-- /baselines -->

Between.

<!-- baselines test_gpu summary -->
<!-- /baselines -->
"""


def test_render_rewrites_only_the_blocks_and_quotes_the_files_numbers():
    rendered = tables.render_page(PAGE, {"test_gpu": data(entry())})
    assert rendered.startswith(
        "# Page\n\nProse that render leaves alone: 1.234 ms.\n\n<!-- baselines test_gpu full -->\n"
    )
    assert "stale text" not in rendered and "\nBetween.\n" in rendered
    full, summary = rendered.split("Between.")
    # gemm_table's row: the times, the better peer (mgpu_best 0.25) over moetune (0.2), cuBLAS's share,
    # the roofline's share, and the winner's label.
    row = "| gate_up | 4 | balanced | 0.200 | 0.500 | 0.250 | - | 1.000 | - | 0.080 | 0.160 | 1.250x | 40% |"
    assert row + " 80.0% | 64x128k64s4 ws-n (pack) |" in full
    assert "python3 lab/bench/bench_gemm.py --out $OUT/a.json" in full
    assert "Measured 2026-01-02 on Test GPU: jax 0.11.2, jaxlib 0.11.2." in full
    assert "| gate_up | 4 | 0.200 | 0.500 | 0.250 | 1.000 | 0.080 | 0.160 |" in summary
    assert tables.render_page(rendered, {"test_gpu": data(entry())}) == rendered  # stable


def test_a_block_for_a_gpu_without_baselines_is_an_error():
    with pytest.raises(ValueError, match="names GPU 'test_gpu', which has no baselines file"):
        tables.render_page(PAGE, {})


def model_entry(phase: str, tokens: int, seconds: float, ragged: float, dense: float) -> dict:
    name = f"bench_model/tiny/{phase}" if phase != "moe_layer" else f"bench_model/tiny/moe_layer/T={tokens}"
    made = entry(
        name=name,
        suite="bench_model",
        unit="s",
        samples=(seconds,),
        params={
            "model": "tiny",
            "layers": 2,
            "batch": 1,
            "prompt": 64,
            "gen": 8,
            "phase": phase,
            "tokens": tokens,
        },
        peers={
            "ragged": {"samples": [ragged], "median": ragged},
            "dense": {"samples": [dense], "median": dense},
        },
    )
    for gemm_only in ("bounds", "config", "from_pack"):
        del made[gemm_only]
    return made


def test_the_model_table_turns_seconds_into_tokens_per_second_and_milliseconds():
    model = [
        model_entry("prefill", 64, 0.032, 0.064, 0.128),
        model_entry("decode", 8, 0.08, 0.16, 0.32),
        model_entry("moe_layer", 64, 0.002, 0.008, 0.004),
    ]
    assert baselines.problems_of(data(*model)) == []
    text = tables.render_full(data(*model))
    assert "| moetune | 2000 | 100.0 | 2.000 |" in text  # 64 / 0.032, 8 / 0.08, 0.002 s
    assert "| XLA ragged_dot | 1000 | 50.0 | 8.000 |" in text
    assert "| dense all-experts einsum | 500 | 25.0 | 4.000 |" in text
    assert "At T=64 moetune's MoE layer runs 4.00x as fast as XLA ragged_dot's and 2.00x" in text


def test_an_fp8_model_run_gets_a_table_of_its_own_with_the_roofline_of_its_weights():
    bf16 = [model_entry("decode", 8, 0.08, 0.16, 0.32)]
    fp8 = model_entry("decode", 8, 0.04, 0.16, 0.32)
    fp8["name"] = "bench_model/tiny/fp8_row_channel/decode"
    fp8["params"] |= {"path": "moetune_fp8", "fp8": "row_channel"}
    fp8["peers"]["moetune"] = {"samples": [0.08], "median": 0.08}
    fp8["bounds"] = {"hbm_roofline_tokens_per_s": 400.0}
    prefill = model_entry("prefill", 64, 0.016, 0.064, 0.128)
    prefill["name"] = "bench_model/tiny/fp8_row_channel/prefill"
    prefill["params"] |= {"path": "moetune_fp8", "fp8": "row_channel"}
    prefill["peers"]["moetune"] = {"samples": [0.032], "median": 0.032}
    bf16.append(model_entry("prefill", 64, 0.032, 0.064, 0.128))
    text = tables.render_full(data(*bf16, fp8, prefill))
    assert "tiny with FP8 experts (row_channel scales), 2 layers" in text
    assert "| moetune, FP8 experts | 4000 | 200.0 | 50% |" in text  # 8 / 0.04 against its own 400 tokens/s
    assert "| moetune | 2000 | 100.0 | - |" in text  # the bf16 path has another roofline: no share
    assert "| moetune | 2000 | 100.0 |\n" in text  # the bf16 run's own table, which has no roofline


def test_the_fused_model_paths_get_rows_of_their_own_and_their_decode_against_the_unfused():
    model = [
        model_entry("prefill", 64, 0.032, 0.064, 0.128),
        model_entry("decode", 8, 0.08, 0.16, 0.32),
        model_entry("moe_layer", 64, 0.002, 0.008, 0.004),
    ]
    for made, fused in zip(model, (0.032, 0.04, 0.001), strict=True):
        made["peers"]["moetune_fused"] = {"samples": [fused], "median": fused}
    text = tables.render_full(data(*model))
    assert "| moetune, fused decode block | 2000 | 200.0 | 1.000 |" in text
    assert text.index("| moetune, fused decode block |") < text.index("| moetune | 2000 |")
    assert "`moetune, fused decode block` decodes at 2.00x the rate of `moetune`." in text
    assert "| moetune, fused decode block | 2000 | 200.0 | 1.000 |" in tables.render_summary(data(*model))


def test_an_fp8_fused_model_path_is_labelled_and_compared_with_the_fp8_one():
    decode = model_entry("decode", 8, 0.04, 0.16, 0.32)
    decode["params"] |= {"path": "moetune_fp8", "fp8": "row_channel"}
    decode["peers"]["moetune_fp8_fused"] = {"samples": [0.02], "median": 0.02}
    prefill = model_entry("prefill", 64, 0.016, 0.064, 0.128)
    prefill["params"] |= {"path": "moetune_fp8", "fp8": "row_channel"}
    prefill["peers"]["moetune_fp8_fused"] = {"samples": [0.016], "median": 0.016}
    text = tables.render_full(data(decode, prefill))
    assert "| moetune, FP8 experts, fused decode block | 4000 | 400.0 |" in text
    assert "decodes at 2.00x the rate of `moetune, FP8 experts`." in text


def test_every_method_and_path_the_benchmarks_write_has_a_label_and_a_place_in_its_table():
    from moetune_lab.bench import bench_block
    from moetune_lab.model import bench as model_bench

    block = set(bench_block.METHODS) - {"moetune"}  # the entry's own time, the rest its peers
    assert block == set(tables.BLOCK_OWN) | set(tables.BLOCK_PEERS)
    assert block <= set(tables.BLOCK_LABELS)
    paths = {*model_bench.RUN_NAMES, model_bench.FP8_PATH, model_bench.FP8_FUSED_PATH}
    assert paths == set(tables.MODEL_PATHS) and paths <= set(tables.LABELS)
    assert tables.FUSED_OF == model_bench.FUSED_REFERENCE


def maxtext_entry(case: str, tokens: int, ms: float, theirs: float, route="ragged_dot", **params) -> dict:
    made = entry(
        name=f"maxtext/tiny/{case}/T={tokens}/{route}",
        suite="maxtext",
        samples=(ms,),
        params={"model": "tiny", "case": case, "tokens": tokens, "layers": 2, "route": route} | params,
        peers={f"maxtext_{route}": {"samples": [theirs], "median": theirs}},
    )
    for gemm_only in ("bounds", "config", "from_pack"):
        del made[gemm_only]
    return made


def test_the_maxtext_table_gives_speedups_and_tokens_per_second_and_compares_no_differing_outputs():
    rows = [
        maxtext_entry("serve/decode", 1, 10.0, 50.0, rel_err=0.0),
        maxtext_entry("step/train", 4096, 100.0, 150.0, "tokamax", rel_err=0.7, parity_failed="differs"),
    ]
    assert baselines.problems_of(data(*rows)) == []
    text = tables.render_full(data(*rows))
    assert "#### MaxText: `lab/bench/bench_maxtext.py`" in text
    assert (
        "| tiny | 2 | serve/decode | 1 | jax.lax.ragged_dot | 10.000 | 50.000 | 5.00x | 100.0 / 20.0 "
        "| 0.0e+00 |" in text
    )
    assert (
        "| tiny | 2 | step/train | 4096 | tokamax ragged_dot | 100.000 | 150.000 | outputs differ: not "
        "compared | - | 7.0e-01 (differ) |" in text
    )
    assert "MaxText with moetune's plug-in" in tables.render_summary(data(*rows))


def test_the_tuner_table_gives_each_measurement_against_its_peer():
    rate = entry(
        name="tuner/two_gpus_vs_one",
        suite="tuner",
        title="two GPUs against one",
        unit="trials/min",
        samples=(400.0, 380.0),
        median=390.0,
        params={},
        peers={"one_gpu": {"samples": [200.0, 190.0], "median": 195.0}},
    )
    for gemm_only in ("bounds", "config", "from_pack"):
        del rate[gemm_only]
    assert baselines.problems_of(data(rate)) == []
    assert "| two GPUs against one | trials/min | 390.0 | one GPU: 195.0 | 2 | 2.00x |" in tables.render_full(
        data(rate)
    )


def test_the_command_line_adds_a_run_and_refuses_a_foreign_file(tmp_path, capsys):
    target = tmp_path / "b.json"
    run = {
        "environment": {
            "date": "2026-01-02T03:04:05Z",
            "device_kind": "Test GPU",
            "jax": "0.11.2",
            "jaxlib": "0.11.2",
            "command": "python3 bench_gemm.py --out /somewhere/run.json",
            "nvidia_smi": "Test GPU, 580.1, 1 MHz",
        },
        "bandwidth": {"read_GBps": 4000.0},
        "cases": [
            {
                "proj": "gate_up",
                "tokens": 4,
                "m": 8,
                "k": 64,
                "n": 128,
                "routing": "balanced",
                "group_sizes": [2, 2, 2, 2],
                "hbm_roofline_ms": 0.16,
                "methods": {
                    "moetune": {"samples_ms": [0.2, 0.1, 0.3], "config": entry()["config"]},
                    "torch_grouped_mm": {"samples_ms": [0.5]},
                },
            }
        ],
    }
    (tmp_path / "run.json").write_text(json.dumps(run))
    assert baselines.main(["add-gemm", str(tmp_path / "run.json"), "--file", str(target)]) == 0
    written = json.loads(target.read_text())
    assert baselines.problems_of(written) == []
    (added,) = written["entries"]
    assert added["command"] == "python3 lab/bench/bench_gemm.py --out $OUT/run.json"
    assert added["versions"] == {"jax": "0.11.2", "jaxlib": "0.11.2", "driver": "580.1"}
    before = target.read_text()
    (tmp_path / "model.json").write_text(json.dumps({"not": "a model run"}))
    capsys.readouterr()
    assert baselines.main(["add-model", str(tmp_path / "model.json"), "--file", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: add-model: a run file lacks the field") and err.count("\n") == 1
    assert target.read_text() == before


def test_render_check_reports_a_stale_page_and_writes_nothing(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    assert baselines.render([page], {"test_gpu": data(entry())}, check=True) == [page]
    assert page.read_text() == PAGE
    assert baselines.render([page], {"test_gpu": data(entry())}, check=False) == [page]
    assert baselines.render([page], {"test_gpu": data(copy.deepcopy(entry()))}, check=True) == []
