"""End-to-end model benchmark: prefill and decode throughput, and one MoE layer alone, per MoE path.

The model is a preset of models/config.py (Mixtral-8x7B, Qwen3-30B-A3B, tiny ones for CPUs) with random
weights; `choices` (a KernelChoices) says which Pallas kernels its small operations run on, and the
result records them as resolved on this backend.

Every path runs on the same weights (one copy: Mixtral-8x7B's experts alone are ~90 GB). For each path:
  prefill   the prompt [batch, prompt] from an empty cache; tokens/s = batch * prompt / median time
  decode    `gen` greedy steps in one jitted fori_loop; tokens/s = batch * gen / median time
  moe       one MoE block (RMSNorm, router, MoE MLP) on layer 0's weights, for each token count in
            `moe_tokens` plus the prefill (batch * prompt) and decode (batch) counts. It runs `reps` times
            inside one jitted loop, each output feeding the next input, so the time per layer excludes
            the host's dispatch; the router sees new inputs each time, so routing varies as in a model.
            A model with shared experts runs them too (dense GEMMs through XLA, the same on every path).
Compile time is measured apart (ahead-of-time lower + compile) and one warm-up call precedes the timed ones.
Timings are host wall clock around block_until_ready: right for programs of milliseconds and more.

The moetune path's MoE MLP takes moe_mlp's fused decode block where `choices.decode_block` (moe_mlp's
decode_mode) asks for it and the block fits; FUSED_PATH ("moetune_fused") is the moetune path once more
with it asked for, so that one run times ragged, the unfused and the fused moetune paths side by side
(and, with `fp8`, the FP8 model on both moetune forms). Each run records which form its MoE blocks took
at decode, at prefill and at each timed token count, with decode_choice's reason (`moe_block`).

Parity against the `dense` path (every expert, einsums: the reference layer): each MoE block's output
at every timed token count (tight), and the model's last-position prefill logits (coarse); each fused
run is also held to its unfused run within the same bounds, so a run without `dense` compares the two
forms still. The result
also records which backend and config `grouped_matmul` chose for each GEMM of the moetune path. The JSON
is rewritten after each path, so a run cut short keeps what it measured (`complete` is false).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import importlib.metadata
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from moetune.kernels.device import current_fingerprint
from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.lookup import LOOKUP
from moetune.kernels.moe import moe_problems, route, sort_by_expert
from moetune_lab.model import mixtral
from moetune_lab.model.config import ModelConfig, model_config
from moetune_lab.model.kernel_choices import DEFAULT_CHOICES, KernelChoices
from moetune_lab.model.moe_paths import MOE_PATHS
from moetune_lab.model.weights import LayerParams, ModelParams, init_params

SCHEMA = "moetune.bench.model"
SCHEMA_VERSION = 1
# The slowest path last: a run cut short by a time limit still has the reference and the tuned path.
DEFAULT_PATHS = ("dense", "moetune", "ragged")
DEFAULT_MOE_TOKENS = (4096, 1)
READ_BANDWIDTH_BYTES = 4 << 30  # far past the L2, as the decode step's weights are
# Reductions in one timed program: one host round trip shared by all, as a decode loop's steps share one.
READ_BANDWIDTH_PASSES = 8
REFERENCE_PATH = "dense"
# Relative L2 errors against the dense path. One MoE block in bf16: the paths differ only in accumulation
# order, measured <= 2e-4 on CPU, while bf16 itself is 4e-3 from a float32 reference; a wrong routing,
# permutation or combine weight gives O(1). Model logits: the block differences compound through the
# layers and through routing flips of near-tied tokens (8 layers on CPU: 1.2e-2 ragged vs dense, and
# 0.15 for a float32 model vs the bf16 one), so this end-to-end check is coarse; the block's is tight.
LAYER_REL_L2_TOL = 2e-2
LOGITS_REL_L2_TOL = 1e-1
# The FP8 model (FP8_PATH: the moetune path on the same experts quantized) against the dense bf16 path:
# one FP8 MoE block is about 7% off the bf16 block (e4m3 keeps 4 significant bits; four quantized
# operands in series: tests/kernels/test_moe_fp8.py), bounded at 10%; its logits, measured 3% off the bf16
# model's on the tiny model (2 layers, CPU), are bounded at 15% with top-1 agreement reported beside.
FP8_PATH = "moetune_fp8"
FP8_LAYER_REL_L2_TOL = 1e-1
FP8_LOGITS_REL_L2_TOL = 1.5e-1
# The moetune path with moe_mlp's fused decode block asked for (decode_block FUSED_MODE), beside the
# paths of MOE_PATHS; with `fp8`, the FP8 model's run of it too.
FUSED_PATH = "moetune_fused"
FP8_FUSED_PATH = "moetune_fp8_fused"
RUN_NAMES = (*MOE_PATHS, FUSED_PATH)
# Each fused run's unfused run, which parity compares it with (within the same bounds as against dense).
FUSED_REFERENCE = {FUSED_PATH: "moetune", FP8_FUSED_PATH: FP8_PATH}
# Decode speedups reported (the first run's decode tokens/s over the second's), where both ran.
DECODE_RATIOS = (
    ("moetune", "ragged"),
    (FUSED_PATH, "moetune"),
    (FUSED_PATH, "ragged"),
    (FP8_FUSED_PATH, FP8_PATH),
)

Progress = Callable[[str], None]


def _stderr(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _labelled(progress: Progress, run: str, message: str) -> None:
    progress(f"{run}: {message}")


@dataclasses.dataclass(frozen=True)
class BenchPlan:
    config: ModelConfig
    batch: int
    prompt: int
    gen: int
    paths: tuple[str, ...]
    moe_tokens: tuple[int, ...]
    runs: int = 3
    seed: int = 0
    choices: KernelChoices = DEFAULT_CHOICES
    # After the paths, the model again with FP8 experts in this scale layout on the moetune path
    # (FP8_PATH); "none": not.
    fp8: str = "none"

    def __post_init__(self) -> None:
        for name in ("batch", "prompt", "gen", "runs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigInvalid(f"{name}={value!r} must be a positive integer")
        if not self.paths:
            raise ConfigInvalid(f"no MoE path given; known: {', '.join(MOE_PATHS)}")
        for path in self.paths:
            if path not in RUN_NAMES:
                raise ConfigInvalid(f"unknown MoE path {path!r}; known: {', '.join(RUN_NAMES)}")
        if any(t < 1 for t in self.moe_tokens):
            raise ConfigInvalid(f"moe_tokens={self.moe_tokens} must all be positive")
        if not isinstance(self.choices, KernelChoices):
            raise ConfigInvalid(f"choices={self.choices!r} must be a KernelChoices")
        if self.fp8 != "none":
            self.fp8_plan  # noqa: B018 - ModelConfig checks the layout against the model's shapes

    @property
    def fp8_plan(self) -> BenchPlan:
        """The plan of the FP8 model: the same model and inputs, FP8 experts, the moetune path."""
        config = dataclasses.replace(self.config, experts_scale_layout=self.fp8)
        return dataclasses.replace(self, config=config, paths=("moetune",), fp8="none")

    @property
    def fused_plan(self) -> BenchPlan:
        """This plan with moe_mlp's fused decode block asked for (decode_block=FUSED_MODE)."""
        choices = dataclasses.replace(self.choices, decode_block=fused_mode())
        return dataclasses.replace(self, choices=choices)

    def model_runs(self) -> list[tuple[str, BenchPlan, str]]:
        """(name, plan, MoE path) of each model run, in order: the paths as given (FUSED_PATH: the moetune
        path on fused_plan), then with `fp8` the FP8 model's moetune run, and its FUSED_PATH one where
        FUSED_PATH is asked for."""
        runs = [
            (FUSED_PATH, self.fused_plan, "moetune") if path == FUSED_PATH else (path, self, path)
            for path in self.paths
        ]
        if self.fp8 != "none":
            runs.append((FP8_PATH, self.fp8_plan, "moetune"))
            if FUSED_PATH in self.paths:
                runs.append((FP8_FUSED_PATH, self.fp8_plan.fused_plan, "moetune"))
        return runs

    @property
    def layer_tokens(self) -> tuple[int, ...]:
        """Token counts of the MoE-layer timings: the requested ones plus the model's prefill and decode."""
        return tuple(sorted({*self.moe_tokens, self.batch * self.prompt, self.batch}, reverse=True))


def fused_mode() -> str:
    """decode_block of the FUSED_PATH runs: "kernel" on a GPU, elsewhere "interpret" (the block in Pallas's
    interpreter: the same kernels' code, for CPU tests and smoke runs)."""
    return "kernel" if jax.default_backend() == "gpu" else "interpret"


def moe_block_record(plan: BenchPlan, layer: LayerParams, path: str, tokens: int) -> dict[str, Any]:
    """Which form the MoE MLP of a block of `tokens` rows takes on `path` under plan.choices: "fused"
    (moe_mlp's fused decode block) or "unfused", decode_choice's reason, and the decode_mode given."""
    choice = mixtral.moe_decode_choice(plan.config, layer, tokens, path, plan.choices.decode_block)
    return {
        "tokens": tokens,
        "decode_block": plan.choices.decode_block,
        "form": "unfused" if choice.config is None else "fused",
        "reason": choice.reason,
    }


def timed(fn: Callable[[], Any], runs: int) -> tuple[list[float], Any]:
    """One warm-up call, then `runs` timed calls; returns the samples and the last call's result."""
    result = jax.block_until_ready(fn())
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        result = jax.block_until_ready(fn())
        samples.append(time.perf_counter() - start)
    return samples, result


def _stats(samples: Sequence[float], **extra: Any) -> dict[str, Any]:
    return {"samples_s": list(samples), "median_s": float(np.median(samples)), **extra}


def compiled(jitted: Any, *args: Any, **static: Any) -> tuple[Any, float]:
    """`jitted` lowered and compiled ahead of time for these arguments, and the seconds that took."""
    start = time.perf_counter()
    executable = jitted.lower(*args, **static).compile()
    return executable, time.perf_counter() - start


def _bench_model_path(
    plan: BenchPlan, params: ModelParams, prompt_tokens: Any, path: str, progress: Progress, read_GBps: float
) -> tuple[dict[str, Any], np.ndarray]:
    """Prefill and decode timings of one path (decode with its share of the HBM roofline at `read_GBps`),
    and its last-position prefill logits [B, V]."""
    static = {"config": plan.config, "moe_path": path, "choices": plan.choices}
    cache = mixtral.KVCache.empty(plan.config, plan.batch, plan.prompt + plan.gen)
    prefill, prefill_compile_s = compiled(mixtral.prefill, params, prompt_tokens, cache, **static)
    progress(f"prefill compiled in {prefill_compile_s:.1f} s")
    state = {"cache": cache}

    def run_prefill() -> Any:
        logits, state["cache"] = prefill(params, prompt_tokens, state["cache"])
        return logits

    prefill_samples, logits = timed(run_prefill, plan.runs)
    first = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    start_pos = jnp.asarray(plan.prompt, jnp.int32)
    decode, decode_compile_s = compiled(
        mixtral.decode_loop, params, first, state["cache"], start_pos, steps=plan.gen, **static
    )
    progress(f"decode compiled in {decode_compile_s:.1f} s")

    def run_decode() -> Any:
        tokens, state["cache"] = decode(params, first, state["cache"], start_pos)
        return tokens

    decode_samples, tokens = timed(run_decode, plan.runs)
    del state["cache"]
    prefill_stats = _stats(prefill_samples, compile_s=prefill_compile_s)
    decode_stats = _stats(decode_samples, compile_s=decode_compile_s)
    prefill_stats["tokens_per_s"] = plan.batch * plan.prompt / prefill_stats["median_s"]
    decode_stats["tokens_per_s"] = plan.batch * plan.gen / decode_stats["median_s"]
    decode_stats["first_tokens"] = np.asarray(tokens)[0, :16].tolist()
    # The HBM roofline of a step at the mean context of the generated tokens, and this path's share.
    step_bytes = plan.config.decode_step_bytes(plan.batch, plan.prompt + plan.gen // 2)
    roofline = read_GBps * 1e9 / step_bytes * plan.batch
    decode_stats |= {
        "roofline_tokens_per_s": roofline,
        "roofline_share": decode_stats["tokens_per_s"] / roofline,
    }
    return {"prefill": prefill_stats, "decode": decode_stats}, np.asarray(logits, np.float32)


def read_bandwidth(runs: int = 5) -> float:
    """GB/s of READ_BANDWIDTH_PASSES reductions over READ_BANDWIDTH_BYTES of bf16 on a GPU (a 64 MiB
    stand-in elsewhere) in one program, the best of `runs`: host wall time, as the decode loop it bounds
    is timed, and with the one host round trip spread over as many passes as the loop spreads it over
    steps (a single 1 ms reduction would charge it all to the bandwidth)."""
    nbytes = READ_BANDWIDTH_BYTES if jax.default_backend() == "gpu" else 64 << 20
    x = jnp.ones((nbytes // 2,), jnp.bfloat16)

    @jax.jit
    def passes(v: Any) -> Any:
        def one_pass(_: Any, total: Any) -> Any:
            # The running total scales the input (by one), so no pass can be hoisted out of the loop.
            scale = (1 + 0 * total).astype(v.dtype)
            return total + jnp.sum(v * scale, dtype=jnp.float32)

        return jax.lax.fori_loop(0, READ_BANDWIDTH_PASSES, one_pass, jnp.float32(0))

    expected = READ_BANDWIDTH_PASSES * x.size
    if abs(float(passes(x)) / expected - 1) > 1e-3:  # every pass ran (float32 sums of ones, not exact)
        raise RuntimeError(f"bandwidth probe summed {float(passes(x))}, not {expected}")
    best = min(timed(lambda: passes(x), runs)[0])
    return READ_BANDWIDTH_PASSES * nbytes / best / 1e9


@functools.partial(jax.jit, static_argnames=("config", "path", "choices"))
def moe_block_loop(
    x: Any,
    layer: LayerParams,
    reps: Any,
    *,
    config: ModelConfig,
    path: str,
    choices: KernelChoices = DEFAULT_CHOICES,
) -> Any:
    """`reps` MoE blocks in a row, each output the next input; reps is traced, so one compile serves the
    single block of the parity check and the timing loop."""
    return jax.lax.fori_loop(0, reps, lambda _, x: _moe_block(x, layer, config, path, choices)[0], x)


@functools.partial(jax.jit, static_argnames=("reps", "config", "path", "choices"))
def moe_block_routing(
    x: Any,
    layer: LayerParams,
    *,
    reps: int,
    config: ModelConfig,
    path: str,
    choices: KernelChoices = DEFAULT_CHOICES,
) -> Any:
    """Rows per expert [reps, E] that each block of `moe_block_loop` routes: the load of the timed layers
    (each block's input is the previous block's output, so later blocks route differently)."""

    def block(x: Any, _: Any) -> tuple[Any, Any]:
        out, logits = _moe_block(x, layer, config, path, choices)
        # The routing moe_mlp does (the combine weights do not change which experts a row goes to).
        experts = route(logits, config.top_k, renormalize=True).expert_ids
        return out, sort_by_expert(experts, config.experts).group_sizes

    return jax.lax.scan(block, x, length=reps)[1]


def _moe_block(
    x: Any, layer: LayerParams, config: ModelConfig, path: str, choices: KernelChoices
) -> tuple[Any, Any]:
    """One MoE block (RMSNorm, router, the path's MoE MLP, the shared experts if any): its output and its
    router logits."""
    h = mixtral.rms_norm(x, layer.moe_norm, config.norm_eps)
    logits = jnp.dot(h, layer.router, preferred_element_type=jnp.float32)
    out = mixtral.routed_experts(config, layer, h, logits, path, choices.routing, choices.decode_block)
    if config.shared_experts:
        out = out + mixtral.shared_experts(layer, h)
    return out, logits


def layer_reps(tokens: int) -> int:
    """MoE blocks per timed call of `moe_block_loop` at `tokens` tokens."""
    # Enough layers per call that host dispatch is noise; empirical, not tuned per device.
    return 5 if tokens >= 1024 else 20


def _bench_moe_layer(
    plan: BenchPlan, layer: LayerParams, path: str, tokens: int, progress: Progress
) -> tuple[dict[str, Any], np.ndarray]:
    """Per-layer time of one MoE block at `tokens` tokens, and that block's output [T, H] for parity."""
    x = jax.random.normal(jax.random.key(plan.seed + tokens), (tokens, plan.config.hidden))
    x = x.astype(jnp.dtype(plan.config.dtype))
    one, reps = jnp.asarray(1, jnp.int32), jnp.asarray(layer_reps(tokens), jnp.int32)
    static = {"config": plan.config, "path": path, "choices": plan.choices}
    loop, compile_s = compiled(moe_block_loop, x, layer, reps, **static)
    output = np.asarray(loop(x, layer, one), np.float32)
    samples, _ = timed(lambda: loop(x, layer, reps), plan.runs + 2)
    per_layer = [s / int(reps) for s in samples]
    routing = np.asarray(moe_block_routing(x, layer, reps=int(reps), **static))
    progress(f"MoE layer at T={tokens}: {np.median(per_layer) * 1e3:.3f} ms")
    stats = _stats(per_layer, tokens=tokens, reps=int(reps), compile_s=compile_s)
    form = moe_block_record(plan, layer, path, tokens)["form"]
    return stats | {"rows_per_expert": routing.tolist(), "moe_block": form}, output


def _dispatch_report(plan: BenchPlan) -> list[dict[str, Any]]:
    """Which backend and config `grouped_matmul` picks for each GEMM of the moetune path, and why."""
    from moetune.kernels.api import explain

    c = plan.config
    report = []
    for tokens in plan.layer_tokens:
        for problem in moe_problems(tokens, c.hidden, c.intermediate, c.experts, c.top_k, c.dtype):
            report.append(explain(problem).to_dict())
    return report


def _compare(value: np.ndarray, reference: np.ndarray, tolerance: float, name: str) -> dict[str, Any]:
    rel_l2 = float(np.linalg.norm(value - reference) / np.linalg.norm(reference))
    return {
        "reference": name,
        "rel_l2": rel_l2,
        "max_abs": float(np.max(np.abs(value - reference))),
        "tolerance": tolerance,
        "ok": bool(np.isfinite(rel_l2) and rel_l2 <= tolerance),
    }


def _check(
    path: str,
    reference: str,
    logits: dict[str, np.ndarray],
    layer_outputs: dict[str, dict[int, np.ndarray]],
) -> dict[str, Any] | None:
    """Run `path` against run `reference`: model logits (with top-1 agreement) and the MoE block alone
    at each token count both timed, within the FP8 bounds where `path` is an FP8 run; None where the two
    have nothing to compare."""
    entry: dict[str, Any] = {}
    fp8 = path in (FP8_PATH, FP8_FUSED_PATH)
    layer_tol = FP8_LAYER_REL_L2_TOL if fp8 else LAYER_REL_L2_TOL
    logits_tol = FP8_LOGITS_REL_L2_TOL if fp8 else LOGITS_REL_L2_TOL
    if path in logits and reference in logits:
        entry["logits"] = _compare(logits[path], logits[reference], logits_tol, reference)
        agree = logits[path].argmax(-1) == logits[reference].argmax(-1)
        entry["logits"]["top1_agreement"] = float(np.mean(agree))
    reference_layers = layer_outputs.get(reference, {})
    entry["moe_layer"] = {
        str(t): _compare(out, reference_layers[t], layer_tol, reference)
        for t, out in layer_outputs.get(path, {}).items()
        if t in reference_layers
    }
    if not (entry.get("logits") or entry["moe_layer"]):
        return None
    checks = [entry["logits"]] if "logits" in entry else []
    entry["ok"] = all(c["ok"] for c in [*checks, *entry["moe_layer"].values()])
    return entry


def _parity(logits: dict[str, np.ndarray], layer_outputs: dict[str, dict[int, np.ndarray]]) -> dict[str, Any]:
    """Each path against the dense path, and each fused run against its unfused run (FUSED_REFERENCE:
    a run without the dense path still compares the two forms): the name of the check is the run's, or
    '<fused run>_vs_<unfused run>'."""
    report: dict[str, Any] = {}
    for path in dict.fromkeys([*logits, *layer_outputs]):
        if path != REFERENCE_PATH and (entry := _check(path, REFERENCE_PATH, logits, layer_outputs)):
            report[path] = entry
    for fused, unfused in FUSED_REFERENCE.items():
        if entry := _check(fused, unfused, logits, layer_outputs):
            report[f"{fused}_vs_{unfused}"] = entry
    return report


def _layer_ratios(results: dict[str, Any], baseline: str, path: str) -> dict[str, float]:
    if "moe" not in results.get(baseline, {}) or "moe" not in results.get(path, {}):
        return {}
    base = {m["tokens"]: m["median_s"] for m in results[baseline]["moe"]}
    return {
        str(m["tokens"]): base[m["tokens"]] / m["median_s"]
        for m in results[path]["moe"]
        if m["tokens"] in base
    }


def _decode_speedup(results: dict[str, Any]) -> dict[str, float]:
    """DECODE_RATIOS' decode tokens/s ratios, for the pairs that both ran."""
    rate = {name: e["decode"]["tokens_per_s"] for name, e in results.items() if "decode" in e}
    return {f"{a}_vs_{b}": rate[a] / rate[b] for a, b in DECODE_RATIOS if a in rate and b in rate}


def _environment(command: str, choices: KernelChoices) -> dict[str, Any]:
    device = current_fingerprint()
    try:
        moetune_version = importlib.metadata.version("moetune")
    except importlib.metadata.PackageNotFoundError:
        moetune_version = "not installed"
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
        "host": platform.node(),
        "device": {**device.to_dict(), "fingerprint": device.hash, "count": jax.device_count()},
        "versions": {
            "python": platform.python_version(),
            "jax": jax.__version__,
            "jaxlib": importlib.metadata.version("jaxlib"),
            "numpy": np.__version__,
            "moetune": moetune_version,
        },
        "env": {k: v for k, v in os.environ.items() if k.startswith(("XLA_", "JAX_", "MOETUNE_"))},
        # How the model-side Pallas kernels ran: the choices given, "auto" resolved for this backend.
        "pallas_kernels": choices.resolved(),
    }


def _write(out: Path | None, result: dict[str, Any]) -> None:
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    partial.write_text(json.dumps(result, indent=1, sort_keys=True))
    partial.replace(out)


def run_model_bench(
    model: str,
    batch: int,
    prompt: int,
    gen: int,
    paths: Sequence[str] = DEFAULT_PATHS,
    layers: int | None = None,
    out: Path | None = None,
    *,
    moe_tokens: Sequence[int] = DEFAULT_MOE_TOKENS,
    runs: int = 3,
    seed: int = 0,
    command: str | None = None,
    use_db: bool = True,
    choices: KernelChoices = DEFAULT_CHOICES,
    fp8: str = "none",
    progress: Progress = _stderr,
) -> dict[str, Any]:
    """Benchmark `paths` on `model` (its preset, `layers` deep); returns the result and writes it to `out`.

    `use_db=False` looks tuned winners up in the shipped config packs only, never in a database (the GPU
    machine has no SQLAlchemy); `choices` picks the model's Pallas kernels (each "auto" by default: the
    kernel on a GPU, XLA elsewhere). `fp8` (a scale layout) also runs the model with FP8 experts on the
    moetune path (FP8_PATH), compared with the dense bf16 path; FUSED_PATH among `paths` runs the moetune
    path once more with moe_mlp's fused decode block asked for (and FP8_FUSED_PATH with `fp8`). Raises
    ConfigInvalid for a bad argument before any work.
    """
    plan = BenchPlan(
        config=model_config(model, layers),
        batch=batch,
        prompt=prompt,
        gen=gen,
        paths=tuple(dict.fromkeys(paths)),
        moe_tokens=tuple(moe_tokens),
        runs=runs,
        seed=seed,
        choices=choices,
        fp8=fp8,
    )
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        **_environment(command or " ".join(sys.argv), choices),
        "model": dataclasses.asdict(plan.config),
        "batch": batch,
        "prompt": prompt,
        "gen": gen,
        "paths": [name for name, _, _ in plan.model_runs()],
        "fp8": fp8,
        "moe_tokens": list(plan.layer_tokens),
        "complete": False,
        "results": {},
    }
    with contextlib.nullcontext() if use_db else LOOKUP.using_db(None):
        return _run(plan, result, out, progress)


def _run(plan: BenchPlan, result: dict[str, Any], out: Path | None, progress: Progress) -> dict[str, Any]:
    seed = plan.seed
    start = time.perf_counter()
    params = jax.block_until_ready(init_params(plan.config, seed))
    result["init_weights_s"] = time.perf_counter() - start
    result["read_GBps"] = read_bandwidth()
    progress(
        f"{plan.config.name} x{plan.config.layers} layers: weights ready in {result['init_weights_s']:.1f} s "
        f"(experts {plan.config.expert_weight_bytes / 1e9:.1f} GB)"
    )
    if {"moetune", FUSED_PATH} & set(plan.paths):
        try:
            result["moetune_dispatch"] = _dispatch_report(plan)
        except Exception as e:  # recorded; the moetune path itself then fails with the same reason
            result["moetune_dispatch"] = f"{type(e).__name__}: {e}"
    prompt_tokens = jax.random.randint(
        jax.random.key(seed + 1), (plan.batch, plan.prompt), 0, plan.config.vocab, dtype=jnp.int32
    )
    logits: dict[str, np.ndarray] = {}
    layer_outputs: dict[str, dict[int, np.ndarray]] = {}
    params_config = plan.config
    for name, run_plan, path in plan.model_runs():
        entry: dict[str, Any] = {}
        result["results"][name] = entry
        if run_plan.config != params_config:
            # The FP8 model after the others: its weights are made once theirs are freed (Mixtral's bf16
            # and FP8 weights together would not fit one H200).
            params = None
            params = jax.block_until_ready(init_params(run_plan.config, seed))
            params_config = run_plan.config
        if run_plan.config.experts_scale_layout != "none":
            entry["experts_GB"] = run_plan.config.expert_weight_bytes / 1e9
        # Which form the MoE MLP takes in a decode step and in prefill, and why.
        entry["moe_block"] = {
            phase: moe_block_record(run_plan, params.layers[0], path, tokens)
            for phase, tokens in (("decode", plan.batch), ("prefill", plan.batch * plan.prompt))
        }
        labelled = functools.partial(_labelled, progress, name)
        # The one place failures are recorded, not raised: one broken path must not lose the others.
        try:
            model_stats, logits[name] = _bench_model_path(
                run_plan, params, prompt_tokens, path, labelled, result["read_GBps"]
            )
            entry.update(model_stats)
            progress(
                f"{name}: prefill {entry['prefill']['tokens_per_s']:.1f} tok/s, "
                f"decode {entry['decode']['tokens_per_s']:.1f} tok/s "
                f"({entry['decode']['roofline_share']:.0%} of the HBM roofline)"
            )
            entry["moe"] = []
            for tokens in run_plan.layer_tokens:
                stats, layer_outputs.setdefault(name, {})[tokens] = _bench_moe_layer(
                    run_plan, params.layers[0], path, tokens, labelled
                )
                entry["moe"].append(stats)
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {e}"
            progress(f"{name}: FAILED {entry['error']}")
        result["parity"] = _parity(logits, layer_outputs)
        result["moe_layer_speedup"] = {
            f"{path}_vs_{base}": _layer_ratios(result["results"], base, path)
            for path, base in (
                ("moetune", "ragged"),
                ("moetune", "dense"),
                (FUSED_PATH, "moetune"),
                (FUSED_PATH, "ragged"),
            )
        }
        result["decode_speedup"] = _decode_speedup(result["results"])
        result["elapsed_s"] = time.perf_counter() - start
        _write(out, result)
    result["complete"] = all("error" not in entry for entry in result["results"].values())
    result["ok"] = result["complete"] and all(check["ok"] for check in result["parity"].values())
    _write(out, result)
    return result


def summary_lines(result: dict[str, Any]) -> list[str]:
    """A plain-text table of the headline numbers (the JSON holds the raw samples)."""
    width = max([12, *(len(path) for path in result["results"])])  # the path column
    lines = [
        f"{result['model']['name']} layers={result['model']['layers']} batch={result['batch']} "
        f"prompt={result['prompt']} gen={result['gen']} on {result['device']['device_kind']}",
        f"{'path':<{width}} {'prefill tok/s':>14} {'decode tok/s':>13}  {'decode MoE':<10}  "
        + "  ".join(f"{'moe T=' + str(t) + ' ms':>14}" for t in result["moe_tokens"]),
    ]
    for path, entry in result["results"].items():
        if "prefill" not in entry:
            lines.append(f"{path:<{width}} failed: {entry.get('error', 'did not finish')}")
            continue
        moe = {m["tokens"]: m["median_s"] for m in entry.get("moe", [])}
        cells = "  ".join(
            f"{moe[t] * 1e3:>14.3f}" if t in moe else f"{'-':>14}" for t in result["moe_tokens"]
        )
        prefill, decode = entry["prefill"]["tokens_per_s"], entry["decode"]["tokens_per_s"]
        form = entry.get("moe_block", {}).get("decode", {}).get("form", "-")
        lines.append(f"{path:<{width}} {prefill:>14.1f} {decode:>13.1f}  {form:<10}  {cells}")
        if "error" in entry:
            lines.append(f"{path:<{width}} failed: {entry['error']}")
    for path, check in result.get("parity", {}).items():
        reference = (check.get("logits") or next(iter(check["moe_layer"].values())))["reference"]
        parts = []
        if "logits" in check:
            logits = check["logits"]
            parts.append(f"logits rel_l2={logits['rel_l2']:.2e} top1={logits['top1_agreement']:.2f}")
        parts += [f"layer T={t} rel_l2={c['rel_l2']:.2e}" for t, c in check["moe_layer"].items()]
        verdict = "ok" if check["ok"] else "MISMATCH"
        lines.append(f"parity {path}: {verdict} vs {reference}: " + ", ".join(parts))
    for path, entry in result["results"].items():
        if (block := entry.get("moe_block", {}).get("decode")) and path.startswith("moetune"):
            lines.append(
                f"decode MoE block {path}: {block['form']} (decode_block={block['decode_block']}: "
                f"{block['reason']})"
            )
    if result.get("decode_speedup"):
        ratios = result["decode_speedup"]
        lines.append("decode speedup: " + ", ".join(f"{k}: {r:.2f}x" for k, r in ratios.items()))
    for name, ratios in result.get("moe_layer_speedup", {}).items():
        if ratios:
            lines.append(
                f"MoE layer speedup {name}: " + ", ".join(f"T={t}: {r:.2f}x" for t, r in ratios.items())
            )
    return lines
