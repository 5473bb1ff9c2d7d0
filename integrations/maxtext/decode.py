"""MaxText's routed MoE at decode sizes on moetune's fused decode block (moe_mlp's `decode_mode`).

The grouped-GEMM stand-ins (hook.py) leave MaxText's routing, permutation and combine as MaxText's own XLA
ops, so the fused decode block (kernels/moe/decode_block.py: routing, both GEMMs and the combine in two
kernels) never runs under them. At up to decode_block.MAX_TOKENS tokens (batch x sequence of one call,
the whole batch: every shard runs the block on all of it), the plug-in's stand-in for
`RoutedMoE.sparse_matmul` asks moe_mlp's `decode_choice` whether the block runs the layer:

    taken     the layer is one `moe_mlp` call (routing, gate_up with SwiGLU, down, combine), which runs the
              block; under expert or tensor parallelism each shard runs it on its slice of experts
              (`group_offset`) and of the ffn, and the shards' outputs are summed
    declined  MaxText's own sparse_matmul runs, its grouped GEMMs on moetune as at any size

`decisions()` lists each decision with its reason, as recording() lists dispatches: what ran, and why the
block did not. A MaxText setting the block does not compute declines it by name (`unsupported`), and so
does moe_mlp's own choice (decode_mode 'auto' without a tuned winner, shapes the block does not tile).

MaxText semantics the block keeps: the gate's scores (`routed_score_func`, softmax or sigmoid, and a
routed bias) are computed by MaxText before sparse_matmul, so they reach the block as its router logits;
MaxText's top-k path then takes the top k of those scores and softmaxes them over the k, which is the
block's renormalize=True (`norm_topk_prob` divides by their sum, one). The load-balance loss, where its
weight is set, is MaxText's own function of the same routing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp

from moetune.kernels.api import Explanation
from moetune.kernels.moe import decode_block
from moetune.kernels.moe.layer import decode_choice, moe_mlp
from moetune.kernels.ops import moe_decode_block
from moetune.kernels.problem import Problem

log = logging.getLogger(__name__)

# Model names whose routing is DeepSeek's (MaxText's get_topk: top-k of biased scores, weights from the
# unbiased ones, group-limited, scaled).
DEEPSEEK_ROUTING_MODELS = ("deepseek3", "deepseek4", "kimi-k2")
# Decoder blocks whose routing or activation is not a softmax over the top-k scores and SwiGLU.
OWN_ROUTING_BLOCKS = {
    "deepseek": "DeepSeek's routing (its weights scaled by routed_scaling_factor)",
    "deepseek4": "DeepSeek's routing (its weights scaled by routed_scaling_factor)",
    "llama4": "Llama 4's routing (the sigmoid of the top-k scores scales the tokens)",
    "gemma4": "Gemma 4's routing (a softmax over all experts, per-expert scales)",
    "gpt_oss": "GPT-OSS's clipped activation",
}
# What RoutedMoE.get_topk and apply_ffn_activation must say for the block to compute MaxText's layer: top-k
# of the gate's scores, a softmax over the k, and act(gate) * up.
KNOWN_ROUTING = (
    "top_k_weights, top_k_indices = jax.lax.top_k(gate_logits, self.num_experts_per_tok)",
    "top_k_weights = jax.nn.softmax(top_k_weights.astype(jnp.float32), axis=-1)",
)
KNOWN_ACTIVATION = ("layer_act = self.activation_fn(layer_w0)", "jnp.multiply(layer_act, layer_w1)")


@dataclasses.dataclass(frozen=True)
class DecodeDecision:
    """One decode-sized RoutedMoE forward the plug-in traced: whether the fused block ran it (`fused`) and
    why (`reason`). `explanation` is the block's dispatch decision where moe_mlp made one; `problem` the
    block's Problem where the layer's settings and whole-layer shapes are the block's (what a sweep tunes
    for decode_mode 'auto' to take it), else None."""

    tokens: int
    fused: bool
    reason: str
    problem: Problem | None = None
    explanation: Explanation | None = None

    def __str__(self) -> str:
        path = "the fused decode block" if self.fused else "MaxText's routed path"
        return f"T={self.tokens}: {path} ({self.reason})"


_DECISIONS: list[list[DecodeDecision]] = []
_DECISIONS_LOCK = threading.Lock()


@contextlib.contextmanager
def decisions() -> Iterator[list[DecodeDecision]]:
    """The plug-in's decode decisions made while the block runs (traces), in order. Nests as recording()."""
    made: list[DecodeDecision] = []
    with _DECISIONS_LOCK:
        _DECISIONS.append(made)
    try:
        yield made
    finally:
        with _DECISIONS_LOCK:
            _DECISIONS.remove(made)


def _record(decision: DecodeDecision) -> DecodeDecision:
    log.info("moetune's MaxText plug-in, routed MoE at %s", decision)
    with _DECISIONS_LOCK:
        for made in _DECISIONS:
            made.append(decision)
    return decision


def routing_difference(layer_class: Any) -> str | None:
    """None where RoutedMoE's top-k routing and activation read as the block computes them (MaxText
    0.2.5's), else what differs: the block then declines every layer, and the grouped GEMMs still serve."""
    for method, lines in (("get_topk", KNOWN_ROUTING), ("apply_ffn_activation", KNOWN_ACTIVATION)):
        try:
            source = inspect.getsource(getattr(layer_class, method))
        except (AttributeError, OSError, TypeError):
            return f"RoutedMoE.{method} cannot be read"
        if not all(line in source for line in lines):
            return f"RoutedMoE.{method} is not the one the plug-in knows"
    return None


def unsupported(layer: Any) -> str | None:
    """The MaxText setting of this RoutedMoE that the fused block does not compute, or None."""
    cfg = layer.config
    get = functools.partial(getattr, cfg)
    block = str(getattr(get("decoder_block", ""), "value", get("decoder_block", "")))
    if str(get("model_name", "")).startswith(DEEPSEEK_ROUTING_MODELS):
        return f"model_name={get('model_name')!r}: DeepSeek's routing (top-k of biased scores, group-limited)"
    if block in OWN_ROUTING_BLOCKS:
        return f"decoder_block={block!r}: {OWN_ROUTING_BLOCKS[block]}"
    if getattr(layer, "is_hash_routing", False):
        return "hash routing: experts looked up by token id"
    if get("use_random_routing", False):
        return "use_random_routing=True"
    if getattr(layer, "per_expert_scale", None) is not None:
        return "per-expert scales of the routing weights"
    activations = list(get("mlp_activations", ["silu", "linear"]))
    if activations[:1] != ["silu"] or any(a != "linear" for a in activations[1:]):
        return f"mlp_activations={activations}: the block fuses SwiGLU (a silu gate times a linear up) only"
    if get("mlp_bias", False):
        return "mlp_bias=True: biases on the experts' GEMMs"
    if layer.should_update_load_balance():
        return "routed_bias_update_rate > 0: the router bias's updates come from MaxText's routing"
    if layer.get_ragged_buffer_factor() > 0:
        factor = layer.get_ragged_buffer_factor()
        return f"ragged_buffer_factor={factor}: a bounded buffer drops tokens past it; the block drops none"
    if get("log_required_ragged_buffer_factor", False) or get("moe_log_max_load_ratio", False):
        return "log_required_ragged_buffer_factor / moe_log_max_load_ratio: statistics of MaxText's buffers"
    if str(getattr(get("shard_mode", "auto"), "value", get("shard_mode", "auto"))) != "auto":
        return f"shard_mode={get('shard_mode')!r}: the block's shards are laid out in auto mode only"
    return None


@dataclasses.dataclass(frozen=True)
class _Shards:
    """How the layer's experts and ffn are split over the mesh: the mesh axes of each (empty: whole)."""

    experts: tuple[str, ...]
    ffn: tuple[str, ...]
    mesh: Any

    def size(self, axes: tuple[str, ...]) -> int:
        sizes = dict(zip(self.mesh.axis_names, self.mesh.devices.shape, strict=True))
        size = 1
        for axis in axes:
            size *= sizes[axis]
        return size


def _shards(layer: Any) -> _Shards:
    """MaxText's own split of the expert weights in its sparse path: experts over the 'exp' axes, the ffn
    over 'mlp_no_fsdp', FSDP gathered (w0 [E, emb, ffn], w1 alike, wo [E, ffn, emb])."""
    mesh = layer.mesh
    if mesh is None or mesh.devices.size == 1:
        return _Shards((), (), mesh)
    spec = layer._logical_to_mesh_axes(("exp", "mlp_no_fsdp"))
    sizes = dict(zip(mesh.axis_names, mesh.devices.shape, strict=True))

    def axes(entry: Any, taken: tuple[str, ...] = ()) -> tuple[str, ...]:
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        return tuple(a for a in names if a != "fsdp" and sizes.get(a, 1) > 1 and a not in taken)

    experts = axes(spec[0])
    return _Shards(experts, axes(spec[1], experts), mesh)


def serving(sparse_matmul: Callable[..., Any], decode_mode: Callable[[], str], routing: str | None) -> Any:
    """The stand-in for RoutedMoE.sparse_matmul: the fused block at decode sizes where it is taken,
    MaxText's sparse_matmul everywhere else. `decode_mode` gives the plug-in's mode when a layer is traced;
    `routing` is routing_difference's finding (None: the block computes MaxText's routing)."""

    @functools.wraps(sparse_matmul)
    def served(
        self: Any,
        inputs: Any,
        gate_logits: Any,
        pre_bias_logits: Any,
        w0_kernel: Any,
        w1_kernel: Any,
        wo_kernel: Any,
        w0_bias: Any,
        w1_bias: Any,
        wo_bias: Any,
        input_ids: Any = None,
        forced_routed_experts: Any = None,
    ) -> Any:
        maxtexts = functools.partial(
            sparse_matmul, self, inputs, gate_logits, pre_bias_logits, w0_kernel, w1_kernel, wo_kernel,
            w0_bias, w1_bias, wo_bias, input_ids=input_ids, forced_routed_experts=forced_routed_experts,
        )  # fmt: skip
        if inputs.ndim != 3 or inputs.shape[0] * inputs.shape[1] > decode_block.MAX_TOKENS:
            return maxtexts()
        tokens = inputs.shape[0] * inputs.shape[1]
        setting = routing or unsupported(self)
        if forced_routed_experts is not None:
            setting = setting or "forced_routed_experts: the experts are given, not routed"
        if setting is not None:
            _record(DecodeDecision(tokens, False, f"MaxText's {setting}"))
            return maxtexts()
        mode, shards = decode_mode(), _shards(self)
        if not _record(_decide(self, shards, mode, inputs, gate_logits, w0_kernel)).fused:
            return maxtexts()
        weights = (w0_kernel, w1_kernel, wo_kernel)
        return _block(self, shards, mode, inputs, gate_logits, pre_bias_logits, *weights)

    return served


def _decide(layer: Any, shards: _Shards, mode: str, inputs: Any, gate_logits: Any, w0: Any) -> DecodeDecision:
    """moe_mlp's decode_choice for one shard's operands (its slice of experts and of the ffn), as _block
    passes them."""
    batch, seq, hidden = inputs.shape
    tokens, experts = batch * seq, gate_logits.shape[-1]
    local_experts = w0.shape[0] // shards.size(shards.experts)
    local_ffn = w0.shape[2] // shards.size(shards.ffn)
    x = jax.ShapeDtypeStruct((tokens, hidden), jnp.dtype(layer.config.dtype))
    logits = jax.ShapeDtypeStruct((tokens, experts), jnp.float32)
    w_gate_up = jax.ShapeDtypeStruct((local_experts, hidden, 2 * local_ffn), x.dtype)
    sliced = bool(shards.experts)
    choice = decode_choice(x, logits, w_gate_up, layer.num_experts_per_tok, decode_mode=mode, sliced=sliced)
    choice.note_declined()  # MaxText's path runs instead of moe_mlp, which would have counted it
    problem = None
    if not sliced:  # the block's winners are tuned for whole layers (a tensor-parallel shard's ffn)
        try:
            problem = moe_decode_block.problem_of(x, logits, w_gate_up, top_k=layer.num_experts_per_tok)
        except ValueError:
            problem = None
    return DecodeDecision(tokens, choice.kernel is not None, choice.reason, problem, choice.explanation)


def _block(
    layer: Any,
    shards: _Shards,
    mode: str,
    inputs: Any,
    gate_logits: Any,
    pre_bias_logits: Any,
    w0: Any,
    w1: Any,
    wo: Any,
) -> tuple[Any, Any, None]:
    """sparse_matmul's (output, load-balance loss, bias updates) from one moe_mlp call per shard."""
    from flax import nnx  # MaxText's own dependency, as the layer is

    cfg = layer.config
    dtype = jnp.dtype(cfg.dtype)
    batch, seq, hidden = inputs.shape
    top_k = layer.num_experts_per_tok
    x = inputs.reshape(batch * seq, hidden).astype(dtype)
    logits = gate_logits.reshape(batch * seq, -1).astype(jnp.float32)
    # MaxText's gmm casts the weights to the layer's dtype; so does the block's one-dtype contract.
    w0, w1, wo = (w.astype(dtype) for w in (w0, w1, wo))
    summed = shards.experts + shards.ffn

    def shard(x: Any, logits: Any, w0: Any, w1: Any, wo: Any) -> Any:
        # The block reads one [E, emb, 2 x ffn] weight, gate columns first. Rather than teach its kernel
        # (decode_block.py) a second weight stream for MaxText's separate gate (w0) and up (w1) weights,
        # the plug-in concatenates a shard's slice of each on every call: a copy of those weights per
        # step. With prefuse_moe_weights both are slices of one stored [E, emb, 2 x ffn] weight, and XLA
        # folds their concatenation back into it (no copy), as for MaxText's own fused gmm.
        w_gate_up = jnp.concatenate([w0, w1], axis=-1)
        offset = None
        if shards.experts:
            offset = (jax.lax.axis_index(shards.experts) * w0.shape[0]).astype(jnp.int32).reshape(1)
        out = moe_mlp(
            x, logits, w_gate_up, wo, top_k=top_k, renormalize=True, decode_mode=mode, group_offset=offset
        )
        if summed:  # each shard's sum over its experts and its ffn columns
            out = jax.lax.psum(out.astype(jnp.float32), summed).astype(out.dtype)
        return out

    if shards.mesh is not None and shards.mesh.devices.size > 1:
        P = jax.sharding.PartitionSpec
        experts, ffn = shards.experts or None, shards.ffn or None
        up, down = P(experts, None, ffn), P(experts, ffn, None)
        shard = jax.shard_map(
            shard, mesh=shards.mesh, in_specs=(P(), P(), up, up, down), out_specs=P(), check_vma=False
        )
    out = shard(x, logits, w0, w1, wo).reshape(batch, seq, hidden)
    # The flags MaxText's sparse path sows, as its dropless runs sow them: nothing dropped.
    layer.sow(nnx.Intermediate, "moe_has_overflow", jnp.zeros((), jnp.bool_))
    if getattr(cfg, "moe_dropless_fallback", None) == "layer":
        layer.sow(nnx.Intermediate, "moe_dropless_fallback", jnp.zeros((), jnp.bool_))
    return out, _load_balance_loss(layer, gate_logits, pre_bias_logits), None


def _load_balance_loss(layer: Any, gate_logits: Any, pre_bias_logits: Any) -> Any:
    """MaxText's load-balance loss of this routing (its own functions, as its permute calls them), or None
    where the config sets no weight for it."""
    cfg = layer.config
    if cfg.load_balance_loss_weight <= 0.0:
        return None
    from maxtext.layers import moe

    scores = pre_bias_logits if pre_bias_logits is not None else gate_logits
    if moe.uses_megatron_seq_aux_loss(cfg):
        return layer.megatron_seq_aux_loss(scores)
    _, selected = layer.get_topk(gate_logits, pre_bias_logits)
    probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(layer.dtype)
    return layer.load_balance_loss(selected, probs)
