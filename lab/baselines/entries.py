"""Baseline entries from the benchmark scripts' own output files (lab/baselines/cli.py add-*).

Each function turns one kind of result file into entries of the baselines schema: moetune's raw samples
and their median, the same measurement of every peer, the parameters that define the measurement, and
where it came from (date, GPU, versions, the command made portable).
"""

from __future__ import annotations

import os
import re
import shlex
import statistics
from pathlib import Path

from moetune_lab.bench import gemm_table

BENCH = Path(__file__).resolve().parents[1] / "bench"


def portable_command(command: str) -> str:
    """The command as anyone would type it from the repository root: a benchmark script named by its path
    under lab/bench/, and every absolute path (the machine's output folder) as $OUT/<its name>.

    'python3 bench_gemm.py --out /data/run/a.json' -> 'python3 lab/bench/bench_gemm.py --out $OUT/a.json'
    """
    words = []
    for word in shlex.split(command):
        if os.path.isabs(word):
            words.append(f"$OUT/{Path(word).name}")
            continue
        if word.endswith((".py", ".sh")) and "/" not in word and (BENCH / word).exists():
            word = f"lab/bench/{word}"
        words.append(shlex.quote(word))
    return " ".join(words)


def measurement(samples: list[float], digits: int) -> dict:
    """Samples rounded to `digits` decimals (the timer's resolution: ns for CUPTI's ms) and their median,
    which has at most one decimal more."""
    samples = [round(s, digits) for s in samples]
    return {"samples": samples, "median": round(statistics.median(samples), digits + 1)}


def driver_version(nvidia_smi: str) -> str | None:
    """The driver from `nvidia-smi --query-gpu=name,driver_version,...` output: 'NVIDIA H200, 580.1, ...'."""
    fields = [f.strip() for f in nvidia_smi.splitlines()[0].split(",")] if nvidia_smi.strip() else []
    return fields[1] if len(fields) > 1 and re.fullmatch(r"\d+(\.\d+)+", fields[1]) else None


def cuda_version(runtime: str) -> str | None:
    """A device fingerprint's runtime as a CUDA version: 'cuda 13000' -> '13.0'."""
    found = re.fullmatch(r"cuda (\d+)", runtime or "")
    return f"{int(found[1]) // 1000}.{int(found[1]) % 1000 // 10}" if found else None


def _known(**values: str | None) -> dict[str, str]:
    return {key: value for key, value in values.items() if value}


def gemm_entries(run: dict) -> list[dict]:
    """One entry per case of a bench_gemm.py --out file that timed moetune: its samples, every other
    method's as a peer, the HBM roofline of the touched weights as a bound, and the winning config."""
    env = run["environment"]
    versions = _versions_of(env)
    entries = []
    for case in run["cases"]:
        moetune = case["methods"].get("moetune", {})
        if "samples_ms" not in moetune:
            continue  # moetune failed or was not asked for: nothing to compare
        config, from_pack = gemm_table.winner_of(moetune)
        peers = {
            name: measurement(method["samples_ms"], 6)
            for name, method in sorted(case["methods"].items())
            if name != "moetune" and "samples_ms" in method
        }
        params = {key: case[key] for key in ("proj", "tokens", "m", "k", "n")}
        params |= {"g": len(case["group_sizes"]), "routing": case["routing"]}
        params |= {"group_sizes": case["group_sizes"], "read_GBps": round(run["bandwidth"]["read_GBps"], 1)}
        entry = {
            "name": f"bench_gemm/{case['proj']}/T={case['tokens']}/{case['routing']}",
            "suite": "bench_gemm",
            "date": env["date"],
            "gpu": env["device_kind"],
            "versions": versions,
            "command": portable_command(env["command"]),
            "unit": "ms",
            **measurement(moetune["samples_ms"], 6),
            "params": params,
            "peers": peers,
            "bounds": {"hbm_roofline": round(case["hbm_roofline_ms"], 6)},
            "config": config,
            "from_pack": from_pack,
        }
        entries.append(_with_failed(entry, case["methods"]))
    return entries


def failed_peers(methods: dict) -> dict[str, str]:
    """The peers of a case that did not run, each with the reason its run file gives ("skipped: budget
    spent", the exception's line): moetune's own methods are not peers, and a method that ran is not
    failed."""
    failed = {}
    for name, method in sorted(methods.items()):
        reason = method.get("error") or method.get("skipped") if isinstance(method, dict) else None
        if not name.startswith("moetune") and "samples_ms" not in method and reason:
            failed[name] = str(reason)[:300]
    return failed


def _with_failed(entry: dict, methods: dict) -> dict:
    failed = {name: why for name, why in failed_peers(methods).items() if name not in entry.get("peers", {})}
    return entry | {"failed_peers": failed} if failed else entry


def _versions_of(env: dict) -> dict[str, str]:
    return _known(
        jax=env.get("jax"),
        jaxlib=env.get("jaxlib"),
        torch=env.get("torch"),
        cuda=env.get("torch_cuda"),
        driver=driver_version(env.get("nvidia_smi", "")),
        python=env.get("python"),
    )


def _timed_entry(env: dict, name: str, suite: str, samples_ms: list[float], **fields) -> dict:
    """An entry of a benchmark's own run file: its environment's date, GPU, versions and command."""
    return {
        "name": name,
        "suite": suite,
        "date": env["date"],
        "gpu": env["device_kind"],
        "versions": _versions_of(env),
        "command": portable_command(env["command"]),
        "unit": "ms",
        **measurement(samples_ms, 6),
        **fields,
    }


def finegrained_entries(run: dict) -> list[dict]:
    """One entry per development-shape case of a bench_gemm.py --models file whose heuristic config was
    timed: what a user gets with no tuning. The fastest of the cost model's alternatives, the tuned
    pack's winner (where the run had one: `moetune_tuned`, its config in params) and every other method
    are peers, the HBM roofline of the touched experts' weights a bound, the heuristic's config the
    config."""
    env = run["environment"]
    entries = []
    for case in run["cases"]:
        heuristic = case["methods"].get("moetune_heuristic", {})
        if "samples_ms" not in heuristic:
            continue  # failed, or cut by the run's budget
        timed = {name: m for name, m in case["methods"].items() if "samples_ms" in m}
        # Of the cost model's alternatives only the fastest: the file stays small. The pack's winner (the
        # tuned config) is a peer of its own: the heuristic's distance to it is the out-of-the-box target.
        tuned = timed.get(case.get("tuned_method") or "moetune_pack")
        others = [m for name, m in timed.items() if name.startswith("moetune_alt") and m is not tuned]
        timed = {name: m for name, m in timed.items() if not name.startswith("moetune_")}
        if others:
            timed["moetune_alternative"] = min(others, key=lambda m: m["median_ms"])
        if tuned is not None:
            timed["moetune_tuned"] = tuned
        peers = {name: measurement(m["samples_ms"], 6) for name, m in sorted(timed.items())}
        problem = case["problem"]
        params = {"model": case["model"], "gemm": case["gemm"], "tokens": case["tokens"], "op": problem["op"]}
        params |= {key: problem[key] for key in ("m", "k", "n", "g")}
        params |= {"touched_experts": case["touched_experts"], "routings": case["routings"]}
        params |= {"read_GBps": round(run["bandwidth"]["read_GBps"], 1)}
        if tuned is not None:
            params["tuned_config"] = tuned["config"]
        name = f"finegrained/{case['model']}/{case['gemm']}/T={case['tokens']}"
        bounds = {"hbm_roofline": round(case["hbm_roofline_ms"], 6)}
        entry = _timed_entry(
            env, name, "finegrained", heuristic["samples_ms"], params=params, peers=peers, bounds=bounds,
            config=heuristic["config"],
        )  # fmt: skip
        entries.append(_with_failed(entry, case["methods"]))
    return entries


# bench_fp8.py's block-scale heuristic tiles timed on the per-channel data: a peer of the block entry.
BLOCK_TILES_PER_CHANNEL = "block_tiles_per_channel"
# bench_fp8.py's variants of the block-scale heuristic's config (bench_fp8.block_variants), peers of
# its entry as moetune_<variant>.
BLOCK_VARIANTS = ("one_block_steps", "staggered", "lockstep")


def fp8_entries(run: dict) -> list[dict]:
    """One entry per case and scale layout of a bench_fp8.py --out file whose heuristic FP8 config was
    timed (what a user gets with no tuning): the fastest of the cost model's alternatives is the peer
    `moetune_alternative`, under block scales the heuristic's tiles at one scale block per K step
    `moetune_one_block_steps`, its consumers staggered `moetune_staggered` (or, where it staggers them,
    in lockstep `moetune_lockstep`), and its tiles on the per-token x per-channel data (no promotion)
    `moetune_same_tiles_row_channel`, torch's FP8 and bf16 grouped GEMMs, moetune's bf16 op and cuBLAS's dense
    FP8 GEMM of the same FLOPs the other peers, the HBM roofline of the touched FP8 weights a bound."""
    env = run["environment"]
    entries = []
    for case in run["cases"]:
        methods = case["methods"]
        own = ("moetune_fp8_", BLOCK_TILES_PER_CHANNEL)  # one layout's methods, not every layout's peers
        shared = {n: m for n, m in methods.items() if not n.startswith(own) and "samples_ms" in m}
        for layout in run["layouts"]:
            prefix = f"moetune_fp8_{layout}_"
            heuristic = methods.get(prefix + "heuristic", {})
            if "samples_ms" not in heuristic:
                continue  # failed, or cut by the run's budget
            others = [m for n, m in methods.items() if n.startswith(prefix + "alt") and "samples_ms" in m]
            timed = dict(shared)
            if others:
                timed["moetune_alternative"] = min(others, key=lambda m: m["median_ms"])
            params = {key: case[key] for key in ("model", "gemm", "tokens", "flops", "touched_experts")}
            params |= {"layout": layout, "routings": case["routings"]}
            params |= {"read_GBps": round(run["bandwidth"]["read_GBps"], 1)}
            if others:
                params["alternative_config"] = timed["moetune_alternative"]["config"]
            per_channel = methods.get(BLOCK_TILES_PER_CHANNEL, {})
            if layout == "block_1x128_128x128" and "samples_ms" in per_channel:
                timed["moetune_same_tiles_row_channel"] = per_channel
            for variant in BLOCK_VARIANTS:
                method = methods.get(prefix + variant, {})
                if "samples_ms" in method:
                    timed[f"moetune_{variant}"] = method
                    params[f"{variant}_config"] = method["config"]
            entry = _timed_entry(
                env,
                f"fp8/{case['model']}/{case['gemm']}/T={case['tokens']}/{layout}",
                "fp8_gemm",
                heuristic["samples_ms"],
                params=params,
                peers={n: measurement(m["samples_ms"], 6) for n, m in sorted(timed.items())},
                bounds={"hbm_roofline": round(case["hbm_roofline_fp8_ms"], 6)},
                config=heuristic["config"],
            )  # fmt: skip
            shared_failed = {n: m for n, m in methods.items() if not n.startswith(own)}
            entries.append(_with_failed(entry, shared_failed))
    return entries


def _backward_cases(run: dict):
    """(methods, heuristic, params) of each case of a bench_backward.py --out file whose heuristic was
    timed."""
    for case in run["cases"]:
        methods = case.get("methods", {})
        heuristic = methods.get("moetune_heuristic", {})
        if "samples_ms" not in heuristic:
            continue
        model, gemm, tokens = case["case"].split("/")  # dev_shapes.Case.name: model/gemm/T<tokens>
        params = {"model": model, "gemm": gemm, "tokens": int(tokens.removeprefix("T"))}
        params |= {"op": "grouped_matmul_drhs"} | {key: case[key] for key in ("m", "k", "n", "g")}
        yield methods, heuristic, params


def backward_entries(run: dict) -> list[dict]:
    """One entry per weight-gradient case of a bench_backward.py --out file whose heuristic config was
    timed. Peers: XLA's ragged_dot_general and torch._grouped_mm (where they ran), the fastest of the cost
    model's next configs, and the half-full-buffer pair (the heuristic on T/2 tokens' rows in a buffer of
    exactly those rows and in one twice as tall)."""
    env = run["environment"]
    entries = []
    for methods, heuristic, params in _backward_cases(run):
        model, gemm = params["model"], params["gemm"]
        timed = {n: m for n, m in methods.items() if "samples_ms" in m and not n.startswith("moetune_")}
        others = [m for n, m in methods.items() if n.startswith("moetune_ranked") and "samples_ms" in m]
        if others:
            timed["moetune_alternative"] = min(others, key=lambda m: m["median_ms"])
        half = methods.get("moetune_half_full", {})
        for side in ("exact", "buffer_2x"):
            if "samples_ms" in half.get(side, {}):
                timed[f"moetune_half_tokens_{side}"] = half[side]
        peers = {name: measurement(m["samples_ms"], 6) for name, m in sorted(timed.items())}
        entries.append(
            _timed_entry(
                env,
                f"backward/drhs/{model}/{gemm}/T={params['tokens']}",
                "backward",
                heuristic["samples_ms"],
                params=params,
                peers=peers,
                config=heuristic["config"],
            )  # fmt: skip
        )
        dlhs = methods.get("moetune_dlhs", {})
        if "samples_ms" in dlhs.get("dlhs", {}) and "samples_ms" in dlhs.get("forward", {}):
            # The input gradient, with the forward op of its shape (the usual weight layout) as its peer:
            # the drhs case's m and g, k and n swapped (dout @ rhs[g]^T).
            entries.append(
                _timed_entry(
                    env,
                    f"backward/dlhs/{model}/{gemm}/T={params['tokens']}",
                    "backward",
                    dlhs["dlhs"]["samples_ms"],
                    params=params | {"op": "grouped_matmul", "k": params["n"], "n": params["k"]},
                    peers={"moetune_forward": measurement(dlhs["forward"]["samples_ms"], 6)},
                    config=dlhs["dlhs"]["config"],
                )  # fmt: skip
            )
    return entries


def backward_config_entries(run: dict) -> list[dict]:
    """One entry per config a bench_backward.py --config run timed beside the heuristic, named by the
    fields it changed (backward/drhs_config/<model>/<gemm>/T=<t>/<field=value,...>), with that run's
    heuristic and torch._grouped_mm as peers: what a tile or pipeline change does, kept apart from the
    heuristic's own entries."""
    env = run["environment"]
    entries = []
    for methods, heuristic, params in _backward_cases(run):
        model, gemm = params["model"], params["gemm"]
        peers = {"moetune_heuristic": measurement(heuristic["samples_ms"], 6)}
        if "samples_ms" in methods.get("torch_grouped_mm", {}):
            peers["torch_grouped_mm"] = measurement(methods["torch_grouped_mm"]["samples_ms"], 6)
        for label, method in sorted(methods.items()):
            if not label.startswith("moetune_config") or "samples_ms" not in method:
                continue
            config = method["config"]
            changed = ",".join(f"{k}={v}" for k, v in config.items() if heuristic["config"].get(k) != v)
            name = f"backward/drhs_config/{model}/{gemm}/T={params['tokens']}/{changed}"
            entries.append(
                _timed_entry(
                    env, name, "backward", method["samples_ms"], params=params, peers=peers, config=config
                )
            )
    return entries


def _moetune_cases(run: dict):
    """(case, moetune's samples, every other method that was timed as a peer) of each case of a layer or
    block benchmark's --out file whose `moetune` method was timed."""
    for case in run["cases"]:
        methods = case.get("methods", {})
        if "samples_ms" not in methods.get("moetune", {}):
            continue
        peers = {
            name: measurement(m["samples_ms"], 6)
            for name, m in sorted(methods.items())
            if name != "moetune" and "samples_ms" in m
        }
        yield case, methods["moetune"]["samples_ms"], peers


def layer_entries(run: dict) -> list[dict]:
    """One entry per case of a bench_layer_grad.py --out file whose moetune step was timed: the MoE layer's
    forward and backward step, with the XLA ragged_dot layer and the torch._grouped_mm layer (where they
    ran) as peers."""
    return [
        _timed_entry(
            run["environment"],
            f"layer_grad/{case['model']}/T={case['tokens']}",
            "layer_grad",
            samples,
            params={"model": case["model"], "tokens": case["tokens"], "gemm_flops": case["gemm_flops"]},
            peers=peers,
        )  # fmt: skip
        for case, samples, peers in _moetune_cases(run)
    ]


def block_entries(run: dict) -> list[dict]:
    """One entry per case of a bench_block.py --out file whose moetune block was timed: the forward MoE
    block, with the same block on tokamax's and XLA's grouped GEMMs and in PyTorch (where they ran) and
    moetune's unfused and fused forms as peers, each stage of moetune's block (median ms), each method's
    kernel count and kernels' times, and what moe_mlp ran for moetune's methods (the block's config and
    its source) in params, and the touched weights' HBM roofline as a bound where the run recorded it."""
    entries = []
    for case, samples, peers in _moetune_cases(run):
        params = {key: case[key] for key in ("model", "tokens", "experts", "top_k", "hidden", "ffn")}
        stages = case.get("stages", {})
        params["stages_ms"] = {n: round(st["median_ms"], 6) for n, st in stages.items() if "median_ms" in st}
        # Kernels each method launches per block: the fused block's claim is a count, not only a time.
        params["kernels"] = {m: r["kernels"] for m, r in case["methods"].items() if "kernels" in r}
        # Where each method's time goes: its kernels' median CUPTI ms, in launch order, by name.
        params["kernel_ms"] = {
            m: [[name, ms] for name, ms in zip(r["kernel_names"], r["kernel_ms"], strict=True)]
            for m, r in case["methods"].items()
            if "kernel_ms" in r
        }
        # What moe_mlp ran for moetune's own methods: the block's config and its source, or why not.
        blocks = {m: r["block"] for m, r in case["methods"].items() if "block" in r}
        if blocks:
            params["block"] = blocks
        fields = {"params": params, "peers": peers}
        if "roofline_ms" in case:  # the touched experts' weight bytes at the HBM read rate
            fields["bounds"] = {"hbm_roofline": round(case["roofline_ms"], 6)}
        name = f"moe_block/{case['model']}/T={case['tokens']}"
        entries.append(_timed_entry(run["environment"], name, "moe_block", samples, **fields))
    return entries


def _fingerprint_versions(device: dict, versions: dict, **more: str | None) -> dict[str, str]:
    """The versions of a run that records moetune's device fingerprint and its own versions."""
    return _known(
        jax=versions.get("jax"),
        jaxlib=versions.get("jaxlib"),
        cuda=cuda_version(device.get("runtime", "")),
        driver=device.get("driver"),
        python=versions.get("python"),
        moetune=versions.get("moetune"),
        **more,
    )


def model_entries(run: dict) -> list[dict]:
    """A bench_model.py --out file: the moetune path's prefill, decode and MoE-layer times in seconds per
    sample, the other paths as peers; params.tokens is what one sample processes (tokens/s = tokens / s).
    A run with FP8 experts measures their path instead (params.path, params.fp8: its scale layout), the
    bf16 paths its peers, under names of its own: it neither replaces nor mixes with the bf16 entries,
    whose decode roofline is another one."""
    device, versions = run["device"], run["versions"]
    model = run["model"]["name"]
    fp8 = run.get("fp8", "none")
    mine = "moetune" if fp8 == "none" else "moetune_fp8"
    prefix = f"bench_model/{model}" if fp8 == "none" else f"bench_model/{model}/fp8_{fp8}"
    shape = {"model": model, "layers": run["model"]["layers"], "batch": run["batch"]}
    shape |= {"prompt": run["prompt"], "gen": run["gen"]}
    shape |= {} if fp8 == "none" else {"path": mine, "fp8": fp8}
    common = {
        "suite": "bench_model",
        "date": run["date"],
        "gpu": device["device_kind"],
        "versions": _fingerprint_versions(device, versions),
        "command": portable_command(run["command"]),
        "unit": "s",
    }
    results = run["results"]
    # A path that failed (bench.py records its error in place of the times it lacks) is no peer there.
    others = [path for path in sorted(results) if path != mine]
    entries = []
    for phase, tokens in (("prefill", run["batch"] * run["prompt"]), ("decode", run["batch"] * run["gen"])):
        entry = {
            "name": f"{prefix}/{phase}",
            **common,
            **measurement(results[mine][phase]["samples_s"], 9),
            "params": shape | {"phase": phase, "tokens": tokens},
            "peers": {
                path: measurement(results[path][phase]["samples_s"], 9)
                for path in others
                if phase in results[path]
            },
        }
        roofline = results[mine][phase].get("roofline_tokens_per_s")
        if roofline:  # a run that measured its read bandwidth: the decode step's HBM roofline, tokens/s
            entry["bounds"] = {"hbm_roofline_tokens_per_s": round(roofline, 3)}
            entry["params"]["read_GBps"] = round(run["read_GBps"], 1)
        entries.append(entry)
    for layer in results[mine]["moe"]:
        peers = {
            path: measurement(theirs["samples_s"], 9)
            for path in others
            for theirs in results[path].get("moe", [])
            if theirs["tokens"] == layer["tokens"]
        }
        entries.append(
            {
                "name": f"{prefix}/moe_layer/T={layer['tokens']}",
                **common,
                **measurement(layer["samples_s"], 9),
                "params": shape | {"phase": "moe_layer", "tokens": layer["tokens"], "reps": layer["reps"]},
                "peers": peers,
            }
        )
    return entries


def _maxtext_path(argument: str) -> str:
    """A MaxText config file as a path inside MaxText's package ('maxtext/configs/base.yml'), wherever
    MaxText was installed on the machine that ran."""
    return re.sub(r"^\S*?/(maxtext/configs/)", r"\1", argument)


def maxtext_entries(run: dict) -> list[dict]:
    """One entry per case of a bench_maxtext.py --out file whose two paths were timed: moetune's plug-in,
    and MaxText's own route (params.route: ragged_dot, tokamax or megablox) as the peer. The command keeps
    the config (its file as a path inside MaxText's package, then the overrides); params the layers the
    model had, the tokens
    one sample processes (tokens/s = tokens / s for the serve cases) and how far the outputs were apart;
    a case timed despite outputs that differ (--time-mismatched) says so in params.parity_failed."""
    env = dict(run["environment"])
    env["command"] = " ".join(_maxtext_path(part) for part in env["command"].split())
    entries = []
    for record in run["records"]:
        methods = record.get("methods", {})
        if "moetune" not in methods or "maxtext" not in methods:
            continue
        params = {
            "model": run["model_name"],
            "case": record["name"],
            "tokens": record["tokens"],
            "layers": run["layers"],
            "route": run["route"],
            "rel_err": float(f"{record['rel_err']:.3g}"),
        }
        if "parity_failed" in record:
            params["parity_failed"] = record["parity_failed"]
        name = f"maxtext/{run['model_name']}/{record['name']}/T={record['tokens']}/{run['route']}"
        peers = {f"maxtext_{run['route']}": measurement(methods["maxtext"]["samples_ms"], 6)}
        entries.append(
            _timed_entry(env, name, "maxtext", methods["moetune"]["samples_ms"], params=params, peers=peers)
        )
    return entries


def tuner_entry(runs: list[dict], *, date: str, versions: dict[str, str], command: str, gpu: str) -> dict:
    """Runs of one tuner measurement, each sample one run's rate: `moetune bench tuner --out` files (Ray
    against one by one, same candidates), compare_clusters.py --out files (two GPUs against one) or
    sweep_timeline.py --json files (one sweep's trials per minute, no peer). None of them records its
    environment, so the caller names it."""
    if runs and all("ray" in r and "sequential" in r for r in runs):
        mine = [r["ray"]["per_minute"] for r in runs]
        theirs = {"sequential": [r["sequential"]["per_minute"] for r in runs]}
        params = {"workers": runs[0]["ray"]["workers"], "problems": runs[0]["problems"]}
        name, unit = "tuner/ray_vs_sequential", "variants/min"
        title = f"Ray, {params['workers']} workers on one GPU, against one by one"
    elif runs and all("base_per_minute" in r and "other_per_minute" in r for r in runs):
        mine = [r["other_per_minute"] for r in runs]
        theirs = {"one_gpu": [r["base_per_minute"] for r in runs]}
        params = {"problems": len(runs[0]["problems"]), "winners_agree": [r["winners_agree"] for r in runs]}
        name, unit = "tuner/two_gpus_vs_one", "trials/min"
        title = "two GPUs of one host against one, same candidates"
    elif runs and all("per_minute" in r and "span_s" in r for r in runs):
        mine, theirs = [r["per_minute"] for r in runs], {}
        params = {key: runs[0][key] for key in ("problems", "workers")}
        params["trials"], params["span_s"] = [r["trials"] for r in runs], [r["span_s"] for r in runs]
        name, unit = f"tuner/sweep/{params['problems']}_problems", "trials/min"
        title = (
            f"one sweep of {params['problems']} problems, {params['workers']} workers on one GPU "
            "(first trial's start to last result)"
        )
    else:
        raise ValueError(
            "each file must be a `moetune bench tuner --out`, a compare_clusters.py --out or a "
            "sweep_timeline.py --json file"
        )
    return {
        "name": name,
        "suite": "tuner",
        "title": title,
        "date": date,
        "gpu": gpu,
        "versions": versions,
        "command": command,
        "unit": unit,
        **measurement(mine, 1),
        "params": params,
        "peers": {peer: measurement(rates, 1) for peer, rates in theirs.items()},
    }


# The TrainConfig fields that define an example run's measurement: its name and params. The learning
# rate, weight decay and seed change the losses, not the work of a step; log_every changes neither.
EXAMPLE_SHAPE = ("layers", "dim", "heads", "experts", "top_k", "ffn", "vocab")


def example_entry(runs: list[dict]) -> dict:
    """Two `examples/train_moe.py --json` outputs of one config, one with `--backend auto` and one with
    `--backend xla` (in either order): moetune's step times (every step after the compiling first one,
    in seconds) with the XLA run's as the peer `xla`; params.tokens is what one step trains on (tokens/s
    = tokens / median), and both runs' final losses and their largest difference over all steps say
    whether the two paths trained alike."""
    by_backend = {run["backend"]: run for run in runs}
    if len(runs) != 2 or set(by_backend) != {"auto", "xla"}:
        backends = ", ".join(str(run["backend"]) for run in runs)
        raise ValueError(f"needs one --backend auto and one --backend xla run, not: {backends}")
    mine, xla = by_backend["auto"], by_backend["xla"]
    differ = sorted(
        key
        for key in mine["config"].keys() | xla["config"].keys()
        if key != "log_every" and mine["config"].get(key) != xla["config"].get(key)
    )
    if differ:
        pairs = ", ".join(f"{k}={mine['config'].get(k)!r} vs {xla['config'].get(k)!r}" for k in differ)
        raise ValueError(f"the auto and xla runs are of different configs: {pairs}")
    if mine["device"]["device_kind"] != xla["device"]["device_kind"]:
        raise ValueError(
            f"the auto run ran on {mine['device']['device_kind']!r}, the xla run on "
            f"{xla['device']['device_kind']!r}"
        )
    for run in (mine, xla):
        if not run["step_times_s"]:
            raise ValueError(f"the {run['backend']} run of --steps 1 has no step after the compiling one")
    config = mine["config"]
    shape = ",".join(f"{key}={config[key]}" for key in EXAMPLE_SHAPE)
    params = {key: config[key] for key in ("batch", "seq", "steps", *EXAMPLE_SHAPE)}
    params["moe_dtype"] = config["moe_dtype"]
    # Where moetune's GEMMs ran (the backends its dispatch chose), when the run recorded them.
    if mine.get("kernels"):
        params["moetune_backends"] = ",".join(sorted({kernel["backend"] for kernel in mine["kernels"]}))
    params["tokens"] = config["batch"] * config["seq"]
    params |= {"final_loss": mine["losses"][-1], "xla_final_loss": xla["losses"][-1]}
    params["max_abs_loss_diff"] = max(abs(a - b) for a, b in zip(mine["losses"], xla["losses"], strict=True))
    return {
        "name": f"train_example/{shape}/batch={config['batch']},seq={config['seq']},{params['moe_dtype']}",
        "suite": "train_example",
        "date": mine["date"],
        "gpu": mine["device"]["device_kind"],
        "versions": _fingerprint_versions(
            mine["device"], mine["versions"], optax=mine["versions"].get("optax")
        ),
        "command": " && ".join(portable_command(run["command"]) for run in (mine, xla)),
        "unit": "s",
        **measurement(mine["step_times_s"], 9),
        "params": params,
        "peers": {"xla": measurement(xla["step_times_s"], 9)},
    }
