"""The Markdown that the documentation quotes from a GPU's baselines (lab/baselines/cli.py render).

`render_page` rewrites every block between `<!-- baselines GPU full -->` (or `summary`) and
`<!-- /baselines -->` of a page from that GPU's baselines and leaves the rest of the page as it is:
`full` is lab/README.md's section (every table, with where each came from), `summary` a shorter one
(the balanced-routing GEMM table, the development shapes and the model's throughput) for a page that
wants it. `<!-- baselines service_loopback full -->` is the service's load table (service.py). Figures
in prose are quotes (quotes.py), not tables.
"""

from __future__ import annotations

import re

from moetune_lab.baselines import service
from moetune_lab.bench import gemm_table

BLOCK = re.compile(r"(<!-- baselines (\S+) (full|summary) -->\n)(.*?)(<!-- /baselines -->)", re.DOTALL)
LABELS = {
    "moetune": "moetune",
    "moetune_fp8": "moetune, FP8 experts",
    "moetune_fused": "moetune, fused decode block",
    "moetune_fp8_fused": "moetune, FP8 experts, fused decode block",
    "torch_grouped_mm": "torch._grouped_mm",
    "tokamax_mosaic": "tokamax ragged_dot (mosaic)",
    "mgpu_best": "ragged_dot_mgpu (best of its sweep)",
    "xla_ragged_dot": "XLA ragged_dot",
    "cublas_torch": "cuBLAS, same FLOPs",
    "ragged": "XLA ragged_dot",
    "dense": "dense all-experts einsum",
    "sequential": "one by one, in one process",
    "one_gpu": "one GPU",
}
VERSION_NAMES = {"cuda": "CUDA", "python": "Python"}
# Every path the model benchmark writes (lab/model/bench.py: MOE_PATHS, the fused and FP8 runs), in row order.
MODEL_PATHS = ("moetune_fp8_fused", "moetune_fp8", "moetune_fused", "moetune", "ragged", "dense")


def _suite(data: dict, suite: str) -> list[dict]:
    return [e for e in data["entries"] if e["suite"] == suite]


def _days(entries: list[dict]) -> str:
    return ", ".join(sorted({e["date"][:10] for e in entries}))


def _versions(entries: list[dict]) -> str:
    """Every distinct set of versions: 'jax 0.11.2, CUDA 13.0, ...; ...'."""
    texts = (", ".join(f"{VERSION_NAMES.get(k, k)} {v}" for k, v in e["versions"].items()) for e in entries)
    return "; ".join(dict.fromkeys(texts))


def _commands(entries: list[dict]) -> list[str]:
    return [f"    {command}" for command in dict.fromkeys(e["command"] for e in entries)] + [""]


def _not_run(entries: list[dict]) -> list[str]:
    """The peers a table's runs tried and could not time, each with the reason its run gave. A "-" cell
    with no line here is a peer the run did not try, or a run older than the record of reasons."""
    lines = [
        f"- `{e['name']}`, {LABELS.get(peer, FP8_LABELS.get(peer, peer))}: {why}"
        for e in entries
        for peer, why in sorted(e.get("failed_peers", {}).items())
    ]
    return ["Peers that did not run, with the reason their run gave:", "", *lines, ""] if lines else []


def _cell(e: dict, peer: str, text: str) -> str:
    """`text` for a peer that ran, "not run" for one listed in failed_peers, else "-"."""
    if peer in e.get("peers", {}):
        return text
    return "not run" if peer in e.get("failed_peers", {}) else "-"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)] + [
        "| " + " | ".join(r) + " |" for r in rows
    ]


# --- grouped GEMMs ---------------------------------------------------------------------------------------


def gemm_cases(entries: list[dict]) -> list[dict]:
    """The bench_gemm entries in the shape gemm_table.rows reads."""
    cases = []
    for e in entries:
        methods = {"moetune": {"median_ms": e["median"]}}
        methods |= {name: {"median_ms": peer["median"]} for name, peer in e["peers"].items()}
        case = {key: e["params"][key] for key in ("proj", "tokens", "routing")}
        case |= {"hbm_roofline_ms": e["bounds"]["hbm_roofline"], "methods": methods}
        case["winner"] = gemm_table.winner_label(e["config"], e.get("from_pack", False))
        cases.append(case)
    return cases


def _shapes(entries: list[dict]) -> str:
    """'gate_up [2T, 4096] x [8, 4096, 28672], down ...': each projection's GEMM, M as a multiple of T."""
    shapes = {}
    for e in entries:
        p = e["params"]
        shapes[p["proj"]] = (
            f"{p['proj']} [{p['m'] // p['tokens']}T, {p['k']}] x [{p['g']}, {p['k']}, {p['n']}]"
        )
    return ", ".join(shapes.values())


def _bandwidth(entries: list[dict]) -> str:
    rates = sorted({f"{e['params']['read_GBps'] / 1000:.2f}" for e in entries if "read_GBps" in e["params"]})
    return "-".join(dict.fromkeys([rates[0], rates[-1]])) + " TB/s" if rates else "unknown"


def gemm_full(data: dict) -> list[str]:
    entries = _suite(data, "bench_gemm")
    if not entries:
        return []
    lines = ["#### Grouped GEMMs: `lab/bench/bench_gemm.py`", ""]
    lines += [f"Measured {_days(entries)} on {data['gpu']}: {_versions(entries)}.", ""] + _commands(entries)
    lines += [
        f"Mixtral-8x7B's MoE GEMMs ({_shapes(entries)}), balanced and Zipf-skewed routing; CUPTI kernel time "
        f"in ms, median of the samples. HBM read bandwidth measured in the runs (the roofline's divisor): "
        f"{_bandwidth(entries)}.",
        "",
    ]
    return lines + gemm_table.rows(gemm_cases(entries)) + [""] + _not_run(entries)


def gemm_summary(data: dict) -> list[str]:
    entries = [e for e in _suite(data, "bench_gemm") if e["params"]["routing"] == "balanced"]
    if not entries:
        return []
    peers = ("torch_grouped_mm", "mgpu_best", "xla_ragged_dot", "cublas_torch")
    rows = []
    for case in sorted(gemm_cases(entries), key=lambda c: (c["proj"] != "gate_up", c["tokens"])):
        ms = {name: method["median_ms"] for name, method in case["methods"].items()}
        cells = [case["proj"], str(case["tokens"]), f"{ms['moetune']:.3f}"]
        cells += [f"{ms[p]:.3f}" if p in ms else "-" for p in peers] + [f"{case['hbm_roofline_ms']:.3f}"]
        rows.append(cells)
    lines = [
        f"Grouped GEMMs, {_days(entries)} ({_versions(entries)}): Mixtral-8x7B's {_shapes(entries)}, "
        "balanced routing, CUPTI kernel time in ms, median of 10.",
        "",
    ]
    lines += _commands(_suite(data, "bench_gemm"))
    return lines + _table(["GEMM", "T", "moetune", *(LABELS[p] for p in peers), "HBM roofline"], rows) + [""]


# --- fine-grained MoE: the development shapes ---------------------------------------------------------------

FINEGRAINED_PEERS = ("torch_grouped_mm", "tokamax_mosaic", "xla_ragged_dot")


def _finegrained_rows(entries: list[dict]) -> list[list[str]]:
    rows = []
    ratio = lambda a, b: f"{a / b:.2f}x" if a and b else "-"  # noqa: E731
    for e in sorted(
        entries, key=lambda e: (e["params"]["model"], e["params"]["gemm"] != "gate_up", e["params"]["tokens"])
    ):
        p, peers = e["params"], {name: peer["median"] for name, peer in e["peers"].items()}
        tuned = peers.get("moetune_tuned")
        best = min([e["median"]] + [v for name, v in peers.items() if name.startswith("moetune_")])
        rivals = [peers[name] for name in FINEGRAINED_PEERS[:2] if name in peers]
        rival = min(rivals) if rivals else None
        cells = [p["model"], p["gemm"], str(p["tokens"]), str(p["g"]), f"{e['median']:.3f}"]
        cells += [f"{tuned:.3f}" if tuned else "-", f"{best:.3f}"]
        cells += [
            _cell(e, name, f"{peers.get(name, 0):.3f}") for name in (*FINEGRAINED_PEERS, "cublas_torch")
        ]
        cells += [ratio(e["median"], tuned), ratio(rival, best), ratio(rival, e["median"])]
        cublas = peers.get("cublas_torch")
        cells += [f"{cublas / best:.0%}" if cublas else "-", f"{e['bounds']['hbm_roofline'] / best:.0%}"]
        rows.append(cells)
    return rows


FINEGRAINED_HEAD = [
    "model", "GEMM", "T", "G", "moetune heuristic", "moetune tuned", "moetune best",
    *(LABELS[p] for p in FINEGRAINED_PEERS), LABELS["cublas_torch"], "heuristic / tuned",
    "faster peer / best", "faster peer / heuristic", "cuBLAS / best", "HBM roofline / best",
]  # fmt: skip


def finegrained_full(data: dict) -> list[str]:
    entries = _suite(data, "finegrained")
    if not entries:
        return []
    lines = ["#### Fine-grained MoE: `lab/bench/bench_gemm.py --models`", ""]
    lines += [f"Measured {_days(entries)} on {data['gpu']}: {_versions(entries)}.", ""] + _commands(entries)
    lines += [
        "The development shapes (lab/bench/dev_shapes.py): each model's expert GEMMs at T tokens routed "
        "top-k uniformly at random; CUPTI kernel time in ms, median of the samples, inputs rotated over "
        "routings that touch more than twice the L2 of weights. `moetune heuristic` is the config the "
        "backend picks with no tuning (the cost model's first; the model's constants were fitted on these "
        "same rows, so this column is fitted, a training-set figure, not a leave-one-out), `moetune tuned` "
        "the shipped pack's winner for the shape, "
        "`moetune best` the fastest of those and the cost model's next two; gate_up is moetune's fused "
        'SwiGLU against the peers\' plain [M, 2F] product. "heuristic / tuned" above 1 is how much '
        "slower the untuned config runs; the peer ratios above 1 mean moetune is faster. HBM read "
        "bandwidth measured in the runs: "
        f"{_bandwidth(entries)}.",
        "",
    ]
    return lines + _table(FINEGRAINED_HEAD, _finegrained_rows(entries)) + [""] + _not_run(entries)


def finegrained_summary(data: dict) -> list[str]:
    entries = _suite(data, "finegrained")
    if not entries:
        return []
    lines = [
        f"Fine-grained MoE, {_days(entries)}: the expert GEMMs of the development shapes (Qwen3, "
        "DeepSeek-V3, Qwen3-Next, Mixtral) at T tokens with the heuristic's config (no tuning), CUPTI "
        "kernel time in ms (lab/README.md has every column and how each was measured).",
        "",
    ]
    return lines + _commands(entries) + _table(FINEGRAINED_HEAD, _finegrained_rows(entries)) + [""]


# --- the MoE block --------------------------------------------------------------------------------------

BLOCK_PEERS = ("tokamax", "torch_grouped_mm", "xla")
# moetune's own forms of the block beside `moetune` (decode_mode "auto"): columns where a run timed them.
BLOCK_OWN = ("moetune_unfused", "moetune_fused")
BLOCK_LABELS = {
    "moetune_unfused": "moetune, unfused",
    "moetune_fused": "moetune, fused decode block",
    "tokamax": "on tokamax ragged_dot",
    "torch_grouped_mm": "PyTorch, torch._grouped_mm",
    "xla": "on XLA ragged_dot",
}
BLOCK_STAGES = ("route", "permute", "gate_up", "down", "combine")


def block_full(data: dict) -> list[str]:
    entries = _suite(data, "moe_block")
    if not entries:
        return []
    lines = ["#### The MoE block: `lab/bench/bench_block.py`", ""]
    lines += [f"Measured {_days(entries)} on {data['gpu']}: {_versions(entries)}.", ""] + _commands(entries)
    lines += [
        "moetune's `moe_mlp` (route, sort, permute, gate_up with SwiGLU fused, down, combine) against the "
        "same block on another grouped GEMM (`moe_mlp_using`: identical routing, permutation and combine) "
        "and a PyTorch block of torch._grouped_mm with the same routing; bf16, the block's inputs are the "
        "tokens and router logits; CUPTI time of every kernel the block launches, median of the samples, "
        "token sets rotated so that no run finds the last one's experts in L2. The stages are moetune's "
        "block cut where moe_mlp composes it, each timed alone. A ratio above 1 means moetune is faster.",
        "",
    ]
    own = [n for n in BLOCK_OWN if any(n in e["peers"] for e in entries)]
    if own:
        lines += [
            '`moetune` is `moe_mlp` as a model calls it (decode_mode "auto"); `moetune, unfused` the block '
            'as separate kernels (decode_mode "xla"), `moetune, fused decode block` its two fused kernels '
            '(decode_mode "kernel"), "-" where they did not run (the block fits decode-sized batches only).',
            "",
        ]
    rows = []
    for e in sorted(entries, key=lambda e: (e["params"]["model"], e["params"]["tokens"])):
        p, peers = e["params"], {name: peer["median"] for name, peer in e["peers"].items()}
        rivals = [peers[n] for n in BLOCK_PEERS[:2] if n in peers]
        cells = [p["model"], str(p["tokens"]), str(p["experts"]), f"{e['median']:.3f}"]
        cells += [f"{peers[n]:.3f}" if n in peers else "-" for n in (*own, *BLOCK_PEERS)]
        cells += [f"{min(rivals) / e['median']:.2f}x" if rivals else "-"]
        cells += [f"{p['stages_ms'][n]:.3f}" if n in p["stages_ms"] else "-" for n in BLOCK_STAGES]
        rows.append(cells)
    head = ["model", "T", "E", "moetune", *(BLOCK_LABELS[n] for n in (*own, *BLOCK_PEERS))]
    head += ["faster peer / moetune"]
    head += [f"stage: {n}" for n in BLOCK_STAGES]
    return lines + _table(head, rows) + [""]


# --- FP8 grouped GEMMs ----------------------------------------------------------------------------------

FP8_PEERS = ("torch_scaled_grouped_mm", "moetune_bf16", "torch_grouped_mm", "cublas_fp8")
FP8_LABELS = {
    "torch_scaled_grouped_mm": "torch._scaled_grouped_mm FP8 rowwise",
    "moetune_bf16": "moetune bf16",
    "torch_grouped_mm": "torch._grouped_mm bf16",
    "cublas_fp8": "cuBLAS FP8, same FLOPs",
}


def fp8_full(data: dict) -> list[str]:
    entries = _suite(data, "fp8_gemm")
    if not entries:
        return []
    lines = ["#### FP8 grouped GEMMs: `lab/bench/bench_fp8.py`", ""]
    lines += [f"Measured {_days(entries)} on {data['gpu']}: {_versions(entries)}.", ""] + _commands(entries)
    lines += [
        "moetune's mosaic_gpu FP8 op (e4m3 operands, float32 scales in the layout named, SwiGLU fused for "
        "gate_up, weights [G, N, K]) with the heuristic's config and, at T >= 1024, the best of the cost "
        "model's next two tile shapes (`best`); torch's FP8 rowwise grouped GEMM on the row_channel data "
        "and the bf16 grouped GEMMs on the weights before quantization (torch's give the [M, N] product "
        "without the activation). CUPTI time, median of the samples, ms; a ratio above 1 means moetune's "
        "best is faster. The roofline share is the touched FP8 weights' bytes at the measured read "
        "bandwidth over moetune's best time.",
        "",
    ]
    rows = []
    order = lambda e: (
        e["params"]["model"],
        e["params"]["gemm"],
        e["params"]["tokens"],
        e["params"]["layout"],
    )  # noqa: E731
    for e in sorted(entries, key=order):
        p, peers = e["params"], {name: peer["median"] for name, peer in e["peers"].items()}
        best = min(e["median"], peers.get("moetune_alternative", e["median"]))
        cells = [p["model"], p["gemm"], str(p["tokens"]), p["layout"], f"{e['median']:.4f}", f"{best:.4f}"]
        cells += [f"{p['flops'] / best / 1e9:.0f}"]
        cells += [_cell(e, n, f"{peers.get(n, 0) / best:.2f}x") for n in FP8_PEERS]
        cells += [f"{e['bounds']['hbm_roofline'] / best:.0%}"]
        rows.append(cells)
    head = ["model", "GEMM", "T", "scales", "heuristic", "best", "TF/s"]
    head += [f"{FP8_LABELS[n]} / moetune" for n in FP8_PEERS] + ["HBM roofline share"]
    return lines + _table(head, rows) + [""] + _not_run(entries)


# --- the model benchmark ---------------------------------------------------------------------------------


def _model_values(entries: list[dict]) -> dict[str, dict[str, float]]:
    """Per path: prefill and decode tokens/s, and the MoE layer's ms at each token count ('T=4096')."""
    out: dict[str, dict[str, float]] = {}
    for e in entries:
        p = e["params"]
        seconds = {p.get("path", "moetune"): e["median"]} | {
            path: peer["median"] for path, peer in e["peers"].items()
        }
        for path, value in seconds.items():
            key = f"T={p['tokens']}" if p["phase"] == "moe_layer" else p["phase"]
            out.setdefault(path, {})[key] = value * 1000 if p["phase"] == "moe_layer" else p["tokens"] / value
    return out


def _layer_tokens(entries: list[dict]) -> list[int]:
    return sorted(
        {e["params"]["tokens"] for e in entries if e["params"]["phase"] == "moe_layer"}, reverse=True
    )


def model_table(entries: list[dict]) -> list[str]:
    values, layers = _model_values(entries), _layer_tokens(entries)
    decode = next(e for e in entries if e["params"]["phase"] == "decode")
    roofline = decode.get("bounds", {}).get("hbm_roofline_tokens_per_s")
    head = ["MoE path", "prefill tokens/s", "decode tokens/s"]
    head += ["decode, share of the HBM roofline"] if roofline else []
    head += [f"MoE layer T={t}, ms" for t in layers]
    measured = decode["params"].get("path", "moetune")  # the roofline is its weights' (FP8 or bf16)
    rows = []
    for path in [p for p in MODEL_PATHS if p in values]:
        v = values[path]
        cells = [LABELS[path], f"{v['prefill']:.0f}", f"{v['decode']:.1f}"]
        if roofline:
            cells += [f"{v['decode'] / roofline:.0%}" if path == measured else "-"]
        rows.append(cells + [f"{v[f'T={t}']:.3f}" for t in layers])
    return _table(head, rows)


def _model_name(params: dict) -> str:
    fp8 = params.get("fp8")
    return params["model"] if fp8 is None else f"{params['model']} with FP8 experts ({fp8} scales)"


def _by_model(entries: list[dict]) -> dict[str, list[dict]]:
    """The model benchmark's entries per model (and per FP8 scale layout, a table of its own), in the order
    the file first names each."""
    out: dict[str, list[dict]] = {}
    for e in entries:
        out.setdefault(f"{e['params']['model']}/{e['params'].get('fp8', 'none')}", []).append(e)
    return out


def model_full(data: dict) -> list[str]:
    all_entries = _suite(data, "bench_model")
    if not all_entries:
        return []
    lines = ["#### The model benchmark: `lab/model/cli.py`", ""]
    lines += [f"Measured {_days(all_entries)} on {data['gpu']}: {_versions(all_entries)}.", ""]
    lines += _commands(all_entries)
    for entries in _by_model(all_entries).values():
        p = entries[0]["params"]
        lines += [
            f"{_model_name(p)}, {p['layers']} layers, batch {p['batch']}, a prompt of {p['prompt']} tokens "
            f"and {p['gen']} generated; host wall time, median of the samples; the MoE layer alone at "
            "each T.",
            "",
        ]
        lines += model_table(entries)
        values, layers = _model_values(entries), _layer_tokens(entries)
        t = f"T={layers[0]}" if layers else None
        if t and "ragged" in values and "moetune" in values:
            ratios = [f"{values['ragged'][t] / values['moetune'][t]:.2f}x as fast as XLA ragged_dot's"]
            if "dense" in values:
                ratios.append(f"{values['dense'][t] / values['moetune'][t]:.2f}x as fast as the dense one")
            decode = values["moetune"]["decode"] / values["ragged"]["decode"]
            lines += [
                "",
                f"At {t} moetune's MoE layer runs {' and '.join(ratios)}; decode {decode:.2f}x XLA's.",
            ]
        lines += _fused_decode(values)
        lines += [""]
    return lines


# Each fused model path and the unfused one it is compared with (lab/model/bench.py FUSED_REFERENCE).
FUSED_OF = {"moetune_fused": "moetune", "moetune_fp8_fused": "moetune_fp8"}


def _fused_decode(values: dict[str, dict[str, float]]) -> list[str]:
    """A line per fused path timed beside its unfused one: their decode rates' ratio."""
    lines = [
        f"`{LABELS[fused]}` decodes at {values[fused]['decode'] / values[unfused]['decode']:.2f}x the rate "
        f"of `{LABELS[unfused]}`."
        for fused, unfused in FUSED_OF.items()
        if fused in values and unfused in values
    ]
    return ["", *lines] if lines else []


# --- MaxText ----------------------------------------------------------------------------------------------

ROUTES = {"ragged_dot": "jax.lax.ragged_dot", "tokamax": "tokamax ragged_dot", "megablox": "megablox gmm"}


NOT_COMPARED = "outputs differ: not compared"


def maxtext_table(entries: list[dict]) -> list[str]:
    """One row per case: MaxText with moetune's plug-in against MaxText's own route, and tokens/s where a
    sample is a serving call. A case whose outputs differ past the bench's bound (params.parity_failed,
    timed with --time-mismatched) computes something else than moetune's: its times are shown, and no
    speedup or rate is made of them."""
    rows = []
    for e in entries:
        p = e["params"]
        theirs = next(iter(e["peers"].values()))["median"]
        serve = p["case"].startswith("serve/")
        differ = "parity_failed" in p
        rate = f"{p['tokens'] / e['median'] * 1e3:,.1f} / {p['tokens'] / theirs * 1e3:,.1f}" if serve else "-"
        speedup = NOT_COMPARED if differ else f"{theirs / e['median']:.2f}x"
        parity = f"{p['rel_err']:.1e}" + (" (differ)" if differ else "")
        rows.append(
            [
                p["model"], str(p["layers"]), p["case"], str(p["tokens"]), ROUTES.get(p["route"], p["route"]),
                f"{e['median']:.3f}", f"{theirs:.3f}", speedup, "-" if differ else rate, parity,
            ]
        )  # fmt: skip
    head = ["model", "layers", "case", "tokens", "MaxText's route", "moetune ms", "MaxText ms", "speedup"]
    return _table(head + ["tokens/s, moetune / MaxText", "outputs' rel. difference"], rows)


def maxtext_full(data: dict) -> list[str]:
    entries = _suite(data, "maxtext")
    if not entries:
        return []
    lines = ["#### MaxText: `lab/bench/bench_maxtext.py`", ""]
    lines += [f"Measured {_days(entries)} on {data['gpu']}: {_versions(entries)}.", ""] + _commands(entries)
    lines += [
        "MaxText's model with moetune's plug-in installed and on MaxText's own route, in one process, on "
        "the same random weights. serve: MaxText's inference engine, wall-clock ms per prefill of the "
        "prompt or per decode step, median; layer (one routed MoE layer) and step (loss and gradients of "
        "the model): CUPTI ms of every kernel of a call, median. The last column is the relative L2 "
        "difference of the outputs (logits, or the layer's output, or every gradient); `(differ)`: past "
        "the bf16 bound of 2e-2, timed all the same (`--time-mismatched`) and not compared: a relative "
        "difference near 1 is another computation, not a rounding. On MaxText's tokamax route "
        '(`use_tokamax_gmm`, tokamax.ragged_dot with implementation="mosaic"), only the training cases '
        "were run and the worst output is a gradient; the plug-in on that route times as on the "
        "jax.lax.ragged_dot route, where it agrees with MaxText to 2e-5. A named, unconfirmed cause: "
        "tokamax's ragged_dot rhs gradient, reported wrong on GPUs (openxla/tokamax#887, tokamax 0.0.10; "
        "this run had 0.0.17).",
        "",
    ]
    return lines + maxtext_table(entries) + [""]


# --- the tuner ---------------------------------------------------------------------------------------------


def tuner_full(data: dict) -> list[str]:
    entries = _suite(data, "tuner")
    if not entries:
        return []
    lines = ["#### The tuner", ""]
    lines += [f"Measured {_days(entries)} on {data['gpu']}: {_versions(entries)}.", ""] + _commands(entries)
    rows = []
    for e in entries:
        if not e["peers"]:  # a rate of its own (a sweep's trials per minute)
            rows.append(
                [e.get("title", e["name"]), e["unit"], f"{e['median']:.1f}", "-", str(len(e["samples"])), "-"]
            )
        for peer, theirs in e["peers"].items():
            rows.append(
                [
                    e.get("title", e["name"]),
                    e["unit"],
                    f"{e['median']:.1f}",
                    f"{LABELS.get(peer, peer)}: {theirs['median']:.1f}",
                    str(len(e["samples"])),
                    f"{e['median'] / theirs['median']:.2f}x",
                ]
            )
    return lines + _table(["measurement", "unit", "moetune", "against", "runs", "ratio"], rows) + [""]


# --- pages -------------------------------------------------------------------------------------------------


def render_full(data: dict) -> str:
    lines = [f"### {data['gpu']}", ""] + gemm_full(data) + finegrained_full(data) + block_full(data)
    lines += fp8_full(data)
    lines += model_full(data)
    lines += maxtext_full(data)
    lines += tuner_full(data)
    return "\n".join(lines).rstrip("\n") + "\n"


def render_summary(data: dict) -> str:
    lines = gemm_summary(data) + finegrained_summary(data)
    model = _suite(data, "bench_model")
    for entries in _by_model(model).values():
        lines += [f"The whole model ({_model_name(entries[0]['params'])}, {_days(entries)}):", ""]
        lines += _commands(entries) + model_table(entries) + [""]
    maxtext = _suite(data, "maxtext")
    if maxtext:
        lines += [f"MaxText with moetune's plug-in against MaxText's own route ({_days(maxtext)}):", ""]
        lines += _commands(maxtext) + maxtext_table(maxtext) + [""]
    return "\n".join(lines).rstrip("\n") + "\n"


def render_page(text: str, baselines: dict[str, dict]) -> str:
    """`text` with every baselines block rendered again from `baselines` (file key -> baselines data)."""

    def block(match: re.Match) -> str:
        start, key, kind, _, end = match.groups()
        if key not in baselines:
            raise ValueError(f"a block names GPU {key!r}, which has no baselines file")
        if "gpu" not in baselines[key]:
            if kind != "full":
                raise ValueError(f"the service's baselines ({key}) have a full table only")
            return start + service.render_full(baselines[key]) + end
        return start + (render_full if kind == "full" else render_summary)(baselines[key]) + end

    return BLOCK.sub(block, text)
