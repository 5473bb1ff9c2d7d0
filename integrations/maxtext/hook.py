"""How the plug-in reaches MaxText's grouped GEMM, and what it checks before it does.

MaxText's RoutedMoE.sparse_matmul (maxtext/layers/moe.py) runs every routed expert GEMM (gate, up and
down, forward and, through their custom VJPs, backward) through one nested function, `gmm`, which picks
an implementation by config:

    megablox=True (MaxText's default)   maxtext.kernels.megablox.gmm, called through the module's name `mblx`
    use_tokamax_gmm=True, unquantized   tokamax.ragged_dot, called through the module's name `tokamax`
    both False (MaxText's GPU configs)  jax.lax.ragged_dot, called through the module's name `jax`

A nested function cannot be replaced from outside, but the names it calls through can: the plug-in puts
stand-ins for `mblx`, `tokamax` and `jax` into MaxText's moe module, whose `gmm`, `ragged_dot` and
`lax.ragged_dot` call moetune.kernels.grouped_matmul. Every other attribute is the real module's, so the
rest of the module (jax.shard_map, jax.lax.ragged_all_to_all, tokamax's RaggedDotGroupSizes, ...) is
untouched; jax.lax.ragged_dot is called nowhere else in that module. The group sizes, the local slice of
experts (`group_offset`) and a receive buffer's rows past sum(group_sizes) keep jax.lax.ragged_dot's
meaning, so the layer's all-to-all, sharding and masks work as they do with MaxText's kernels; moetune's
own custom VJP gives the backward (dlhs and the weight gradient, each its own tuned problem).

What cannot be served raises MaxTextConfigUnsupported, one line naming the setting, when the layer is
traced, never a silent run of MaxText's own kernels: MaxText's dense einsum (sparse_matmul=False),
quantized experts, the gmm v2 kernels, embedding-chunked partial sums, the TransformerEngine MoE block,
the vLLM fused MoE, and DeepSeek's batch-split schedule (its own MoE code, whose megablox calls get a
refusing stand-in).

At decode sizes the plug-in goes one step further: its stand-in for RoutedMoE.sparse_matmul runs the
whole layer (routing, both GEMMs, combine) as moetune's fused decode block where moe_mlp's decode_choice
takes it (`install(decode_mode=...)`, decode.py), and MaxText's sparse_matmul otherwise; decode.decisions()
says which ran and why.

Recognition: install() compares megablox gmm's parameters, sparse_matmul's parameters and its calls with
the ones this module was written against (MaxText 0.2.5); any difference raises MaxTextNotRecognized
naming it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import jax.numpy as jnp

from moetune.integrations.maxtext import decode
from moetune.kernels.api import grouped_matmul
from moetune.kernels.errors import ConfigInvalid, MoetuneError
from moetune.kernels.moe import pallas_mode

MOE_MODULE = "maxtext.layers.moe"
# MaxText modules with an MoE of their own that imports megablox and tokamax directly (DeepSeek's batch-split
# schedule); their calls are refused, not served.
OWN_MOE_MODULES = ("maxtext.models.deepseek_batchsplit", "maxtext.models.deepseek_batchsplit_fp8")
# maxtext.kernels.megablox.gmm's parameters, in order, as the stand-in takes them.
MEGABLOX_GMM_PARAMETERS = (
    "lhs", "rhs", "group_sizes", "preferred_element_type", "tiling", "group_offset", "existing_out",
    "transpose_rhs", "interpret", "lhs_quantize_dtype", "rhs_quantize_dtype", "use_qwix_quantization",
    "use_tokamax_backend", "weight_gather_axes", "lhs_vma_axes", "rhs_vma_axes", "qwix_rule",
    "use_manual_quantization", "use_gmm_v2", "use_gmm_v2_heuristic_tiling", "partial_sum",
)  # fmt: skip
# The calls sparse_matmul's gmm makes, one per route, each through a module name the plug-in replaces.
SPARSE_MATMUL_CALLS = ("mblx.gmm(", "tokamax.ragged_dot(", "jax.lax.ragged_dot(")
# RoutedMoE.sparse_matmul's parameters, in order, as its decode stand-in (decode.serving) takes them.
SPARSE_MATMUL_PARAMETERS = (
    "self", "inputs", "gate_logits", "pre_bias_logits", "w0_kernel", "w1_kernel", "wo_kernel", "w0_bias",
    "w1_bias", "wo_bias", "input_ids", "forced_routed_experts",
)  # fmt: skip
LAYER_CLASS = "RoutedMoE"


class MaxTextNotRecognized(MoetuneError, RuntimeError):
    """The installed MaxText's MoE code is not the one the plug-in was written against."""


class MaxTextConfigUnsupported(ConfigInvalid):
    """A MaxText setting would run an MoE GEMM the plug-in cannot serve."""


@dataclasses.dataclass(frozen=True)
class _Patch:
    """What install() replaced, to be put back by uninstall()."""

    moe: Any
    mblx: Any
    tokamax: Any
    jax: Any
    call: Callable[..., Any]
    sparse_matmul: Callable[..., Any]
    own_moe: tuple[tuple[Any, str, Any], ...]  # (module, name, original) of OWN_MOE_MODULES
    decode_mode: str = "auto"  # moe_mlp's, for decode-sized layers (decode.py)


# The one piece of process state: MaxText's module is patched or not, and this says with what.
_patch: _Patch | None = None


class _StandIn:
    """A module's stand-in: the given names replaced, every other attribute the module's own."""

    def __init__(self, module: Any, **replaced: Any) -> None:
        self._module = module
        self.__dict__.update(replaced)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def __repr__(self) -> str:
        return f"<moetune stand-in for {getattr(self._module, '__name__', self._module)!r}>"


def is_installed() -> bool:
    return _patch is not None


def install(decode_mode: str = "auto") -> None:
    """Make MaxText's routed MoE call moetune's grouped GEMM, and at decode sizes its fused decode block
    where moe_mlp's `decode_mode` takes it ("auto": where a sweep timed the block faster; "kernel",
    "interpret" (CPU tests), "xla": never). Idempotent; installed already, it takes the new decode_mode.
    Raises MaxTextNotRecognized if MaxText is missing or its MoE code differs from the one this plug-in
    knows, ConfigInvalid for an unknown decode_mode."""
    global _patch
    pallas_mode.check(decode_mode, "decode_mode")
    if _patch is not None:
        _patch = dataclasses.replace(_patch, decode_mode=decode_mode)
        return
    moe = _import(MOE_MODULE)
    layer = _recognise(moe)
    own = []
    for name in OWN_MOE_MODULES:
        module = _import(name)
        for attr in ("megablox", "tokamax"):
            if hasattr(module, attr):
                refusal = _refusing(f"{name.rsplit('.', 1)[-1]} (use_batch_split_schedule=True)")
                replaced = "gmm" if attr == "megablox" else "ragged_dot"
                own.append((module, attr, getattr(module, attr)))
                setattr(module, attr, _StandIn(getattr(module, attr), **{replaced: refusal}))
    routing = decode.routing_difference(layer)
    _patch = _Patch(
        moe, moe.mblx, moe.tokamax, moe.jax, layer.__call__, layer.sparse_matmul, tuple(own), decode_mode
    )
    moe.mblx = _StandIn(moe.mblx, gmm=_megablox_gmm)
    moe.tokamax = _StandIn(moe.tokamax, ragged_dot=_tokamax_ragged_dot)
    moe.jax = _StandIn(moe.jax, lax=_StandIn(moe.jax.lax, ragged_dot=_lax_ragged_dot))
    layer.__call__ = _checked(layer.__call__)
    layer.sparse_matmul = decode.serving(layer.sparse_matmul, _decode_mode, routing)


def _decode_mode() -> str:
    """The installed plug-in's decode_mode, read when a layer is traced ("xla" once uninstalled: a model
    traced later runs MaxText's own path)."""
    return "xla" if _patch is None else _patch.decode_mode


def uninstall() -> None:
    """Put MaxText's own grouped GEMM back (a no-op if the plug-in is not installed). A model traced while
    it was installed keeps moetune's kernels in its compiled program."""
    global _patch
    if _patch is None:
        return
    patch, _patch = _patch, None
    patch.moe.mblx, patch.moe.tokamax, patch.moe.jax = patch.mblx, patch.tokamax, patch.jax
    getattr(patch.moe, LAYER_CLASS).__call__ = patch.call
    getattr(patch.moe, LAYER_CLASS).sparse_matmul = patch.sparse_matmul
    for module, attr, original in patch.own_moe:
        setattr(module, attr, original)


@contextlib.contextmanager
def installed(decode_mode: str = "auto") -> Iterator[None]:
    """install(decode_mode) for the block, then uninstall() (unless it was installed before the block:
    then its decode_mode is put back)."""
    before = _patch.decode_mode if _patch is not None else None
    install(decode_mode)
    try:
        yield
    finally:
        if before is None:
            uninstall()
        elif is_installed():
            install(before)


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise MaxTextNotRecognized(
            f"cannot import {name} ({e}); install MaxText with `pip install 'moetune[maxtext]'`"
        ) from e


def _recognise(moe: Any) -> Any:
    """MaxText's RoutedMoE class, once its module looks as this plug-in expects (MaxTextNotRecognized
    naming the first difference otherwise)."""
    version = _version()

    def unknown(what: str) -> MaxTextNotRecognized:
        return MaxTextNotRecognized(
            f"MaxText {version}: {what}; moetune's plug-in knows MaxText 0.2.5's MoE (docs/maxtext.md)"
        )

    for name in ("mblx", "tokamax", "jax", LAYER_CLASS):
        if not hasattr(moe, name):
            raise unknown(f"{MOE_MODULE} has no {name}")
    if any(isinstance(getattr(moe, name), _StandIn) for name in ("mblx", "tokamax", "jax")):
        raise unknown(f"{MOE_MODULE} is patched already (by another copy of the plug-in?)")
    gmm = getattr(moe.mblx, "gmm", None)
    if gmm is None or tuple(inspect.signature(gmm).parameters) != MEGABLOX_GMM_PARAMETERS:
        raise unknown("megablox's gmm takes other parameters than the plug-in serves")
    layer = getattr(moe, LAYER_CLASS)
    try:
        source = inspect.getsource(layer.sparse_matmul)
    except (AttributeError, OSError, TypeError) as e:
        raise unknown(f"{LAYER_CLASS}.sparse_matmul cannot be read ({e})") from e
    missing = [call for call in SPARSE_MATMUL_CALLS if call not in source]
    if missing:
        raise unknown(f"{LAYER_CLASS}.sparse_matmul makes no {', '.join(missing)} call")
    if tuple(inspect.signature(layer.sparse_matmul).parameters) != SPARSE_MATMUL_PARAMETERS:
        raise unknown(f"{LAYER_CLASS}.sparse_matmul takes other parameters than the plug-in serves")
    # The `jax` stand-in changes jax.lax.ragged_dot for the whole module: only gmm's route may call it.
    calls = inspect.getsource(moe).count("jax.lax.ragged_dot(")
    if calls != 1:
        raise unknown(f"{MOE_MODULE} calls jax.lax.ragged_dot in {calls} places, not only in gmm")
    return layer


def _version() -> str:
    try:
        return importlib.import_module("maxtext.version").__version__
    except (ImportError, AttributeError):
        return "(version unknown)"


def check_config(config: Any) -> None:
    """MaxTextConfigUnsupported (one line, naming the setting) if a routed MoE layer of this MaxText config
    would run a GEMM the plug-in cannot serve."""
    setting = _unsupported(config)
    if setting is not None:
        raise MaxTextConfigUnsupported(f"moetune's MaxText plug-in cannot serve {setting}")


def _unsupported(config: Any) -> str | None:
    get = functools.partial(getattr, config)
    if get("quantization", None):
        return f"quantization={get('quantization')!r}: it serves the experts unquantized"
    if get("use_batch_split_schedule", False):
        return "use_batch_split_schedule=True: DeepSeek's batch-split MoE calls its kernels itself"
    if get("te_moe_block", False):
        return "te_moe_block=True: TransformerEngine's MoE block runs its own GEMMs"
    if get("attention", "") in ("vllm_rpa", "vllm_batched_rpa"):
        return f"attention={get('attention')!r}: the vLLM fused MoE runs its own GEMMs"
    if not get("sparse_matmul", True):
        return "sparse_matmul=False: MaxText's dense einsum has no grouped GEMM; set sparse_matmul=True"
    if get("use_gmm_v2", False):
        return "use_gmm_v2=True: the v2 kernels take tilings and partial sums of their own"
    if get("num_moe_emb_chunks", 0) > 0:
        return f"num_moe_emb_chunks={get('num_moe_emb_chunks')}: chunked partial sums"
    return None


def _checked(call: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(call)
    def checked_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        check_config(self.config)
        return call(self, *args, **kwargs)

    return checked_call


def _refusing(what: str) -> Callable[..., Any]:
    def refuse(*_: Any, **__: Any) -> Any:
        raise MaxTextConfigUnsupported(f"moetune's MaxText plug-in cannot serve {what}")

    return refuse


def _megablox_gmm(
    lhs: Any,
    rhs: Any,
    group_sizes: Any,
    preferred_element_type: Any = jnp.float32,
    tiling: Any = None,
    group_offset: Any = None,
    existing_out: Any = None,
    transpose_rhs: bool = False,
    interpret: Any = None,
    lhs_quantize_dtype: Any = None,
    rhs_quantize_dtype: Any = None,
    use_qwix_quantization: bool = False,
    use_tokamax_backend: bool = False,
    weight_gather_axes: Any = None,
    lhs_vma_axes: tuple = (),
    rhs_vma_axes: tuple = (),
    qwix_rule: Any = None,
    use_manual_quantization: bool = False,
    use_gmm_v2: bool = False,
    use_gmm_v2_heuristic_tiling: bool = False,
    partial_sum: Any = None,
) -> Any:
    """megablox.gmm's stand-in. `tiling`, `interpret` and the vma axes are MaxText's kernels' own business
    (moetune picks tiles from its winners and casts operands to a common varying type itself);
    weight_gather_axes only gather quantized weights. The rest must be unset."""
    del tiling, interpret, use_tokamax_backend, weight_gather_axes, lhs_vma_axes, rhs_vma_axes
    del use_gmm_v2_heuristic_tiling
    refused = {
        "lhs_quantize_dtype": lhs_quantize_dtype,
        "rhs_quantize_dtype": rhs_quantize_dtype,
        "use_qwix_quantization": use_qwix_quantization,
        "qwix_rule": qwix_rule,
        "use_manual_quantization": use_manual_quantization,
        "use_gmm_v2": use_gmm_v2,
        "existing_out": existing_out,
        "partial_sum": partial_sum,
    }
    set_ = [name for name, value in refused.items() if value is not None and value is not False]
    if set_:
        raise MaxTextConfigUnsupported(f"moetune's MaxText plug-in cannot serve a gmm with {', '.join(set_)}")
    return _grouped_matmul(lhs, rhs, group_sizes, group_offset, preferred_element_type, transpose_rhs)


def _tokamax_ragged_dot(
    lhs: Any,
    rhs: Any,
    group_sizes: Any,
    precision: Any = None,
    preferred_element_type: Any = None,
    group_offset: Any = None,
    activation: Any = None,
    manual_axis_type: Any = None,
    *,
    implementation: Any = None,
    bypass_device_check: Any = None,
    zero_initialize: bool = False,
    fuse_gateup_activation: Any = None,
) -> Any:
    """tokamax.ragged_dot's stand-in (tokamax 0.0.17's parameters). group_sizes may be tokamax's
    RaggedDotGroupSizes (its `value` is the array); moetune accumulates in float32 whatever `precision`
    asks."""
    del precision, implementation, bypass_device_check, zero_initialize, manual_axis_type
    if activation is not None or fuse_gateup_activation is not None:
        raise MaxTextConfigUnsupported(
            "moetune's MaxText plug-in cannot serve a ragged_dot with an activation"
        )
    sizes = getattr(group_sizes, "value", group_sizes)
    return _grouped_matmul(lhs, rhs, sizes, group_offset, preferred_element_type)


def _lax_ragged_dot(
    lhs: Any,
    rhs: Any,
    group_sizes: Any,
    precision: Any = None,
    preferred_element_type: Any = None,
    group_offset: Any = None,
) -> Any:
    """jax.lax.ragged_dot's stand-in (jax 0.11.2's parameters), for MaxText's third route."""
    del precision
    return _grouped_matmul(lhs, rhs, group_sizes, group_offset, preferred_element_type)


def _grouped_matmul(
    lhs: Any, rhs: Any, group_sizes: Any, group_offset: Any, out_dtype: Any, transpose_rhs: bool = False
) -> Any:
    if hasattr(lhs, "qvalue") or hasattr(rhs, "qvalue"):  # qwix's QArray
        raise MaxTextConfigUnsupported("moetune's MaxText plug-in cannot serve quantized (QArray) operands")
    return grouped_matmul(
        lhs,
        rhs,
        group_sizes,
        transpose_rhs=transpose_rhs,
        preferred_element_type=out_dtype,
        group_offset=_group_offset(group_offset, group_sizes, rhs),
    )


def _group_offset(group_offset: Any, group_sizes: Any, rhs: Any) -> Any:
    """jax.lax.ragged_dot's (1,) group_offset, or None when rhs holds every group from the first: MaxText
    passes a Python 0 for "no slice" and a traced expert index for a ring-of-experts slice."""
    whole = group_sizes.shape[0] == rhs.shape[0]
    if group_offset is None or (whole and isinstance(group_offset, int) and group_offset == 0):
        return None if whole else jnp.zeros((1,), jnp.int32)
    return jnp.asarray(group_offset, jnp.int32).reshape(1)
