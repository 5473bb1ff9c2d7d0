"""A Hugging Face config.json -> the ModelShapes a model YAML builds: the MoE layer's shapes per shard.

Each family names the same facts differently; FAMILIES says where each one's are:

    model_type               routed experts     expert ffn             shared experts: count x ffn
    mixtral                  num_local_experts  intermediate_size      none
    qwen2_moe, qwen3_next    num_experts        moe_intermediate_size  1 x shared_expert_intermediate_size
    qwen3_moe                num_experts        moe_intermediate_size  none
    deepseek_v2/v3/v32,      n_routed_experts   moe_intermediate_size  n_shared_experts x (expert ffn)
      kimi_k2, glm4_moe
    gpt_oss                  num_local_experts  intermediate_size      none
    llama4 (its text_config) num_local_experts  intermediate_size      1 x intermediate_size

Every family takes top_k from num_experts_per_tok (gpt_oss's older files: experts_per_token), hidden from
hidden_size, the dtype from torch_dtype (newer files: dtype; neither: bfloat16) and the activation from
hidden_act (silu: swiglu; tanh-approximated gelu: geglu); gpt_oss's experts apply a clamped SwiGLU, tuned
as the plain gate_up GEMM (plan.UNFUSED_ONLY_ACTIVATIONS). A quantization_config (DeepSeek-V3's FP8,
gpt-oss's MXFP4 experts) is not read: the problems are the model's GEMMs in its torch_dtype. Only the
MoE layers' shapes matter: which layers are dense (first_k_dense_replace, mlp_only_layers,
interleave_moe_layer_step) changes how often the problems run, not what they are.

`tp` and `ep` shard the layer as tuner/plan.py describes (TP splits each expert's ffn, EP the experts;
token buckets then count one EP shard's tokens); a sweep names such a model by `reference(path, tp, ep)`,
e.g. "hf:tp=1,ep=8:/models/DeepSeek-V3/config.json", which plan.load_model reads back.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.input_files import read_input_file
from moetune.kernels.problem import dtype_name
from moetune.tuner.plan import DEFAULT_TOKEN_BUCKETS, ModelShapes, SharedExperts

PREFIX = "hf:"
TOP_K_FIELDS = ("num_experts_per_tok",)
HIDDEN_ACTS = {  # hidden_act -> the gated activation its experts compute
    "silu": "swiglu",
    "swish": "swiglu",
    "gelu_pytorch_tanh": "geglu",
    "gelu_new": "geglu",
    "gelu_fast": "geglu",
}


@dataclasses.dataclass(frozen=True)
class Family:
    """Where one model_type's config keeps the MoE layer's facts (field names)."""

    experts: str
    ffn: str
    top_k: tuple[str, ...] = TOP_K_FIELDS  # the first one present
    shared_count: str | int | None = None  # a field, or a fixed count; None: no shared experts
    shared_ffn: str | None = None
    activation: str | None = None  # fixed; None: from hidden_act
    text_config: bool = False  # the decoder's fields sit in "text_config" (multimodal configs)


_QWEN_SHARED = {"shared_count": 1, "shared_ffn": "shared_expert_intermediate_size"}
_DEEPSEEK = Family(
    "n_routed_experts",
    "moe_intermediate_size",
    shared_count="n_shared_experts",
    shared_ffn="moe_intermediate_size",
)
_LLAMA4 = {"shared_count": 1, "shared_ffn": "intermediate_size"}

FAMILIES: dict[str, Family] = {
    "mixtral": Family("num_local_experts", "intermediate_size"),
    "qwen2_moe": Family("num_experts", "moe_intermediate_size", **_QWEN_SHARED),
    "qwen3_moe": Family("num_experts", "moe_intermediate_size"),
    "qwen3_next": Family("num_experts", "moe_intermediate_size", **_QWEN_SHARED),
    "deepseek_v2": _DEEPSEEK,
    "deepseek_v3": _DEEPSEEK,
    "deepseek_v32": _DEEPSEEK,  # DeepSeek-V3.2: V3's MoE layer under a sparse attention
    "kimi_k2": _DEEPSEEK,  # Kimi K2 ships DeepSeek-V3's architecture under a model_type of its own
    "glm4_moe": _DEEPSEEK,
    "gpt_oss": Family(
        "num_local_experts",
        "intermediate_size",
        top_k=("num_experts_per_tok", "experts_per_token"),
        activation="clamped_swiglu",
    ),
    "llama4": Family("num_local_experts", "intermediate_size", text_config=True, **_LLAMA4),
    "llama4_text": Family("num_local_experts", "intermediate_size", **_LLAMA4),
}


def load_hf_config(
    path: str | Path, *, tp: int = 1, ep: int = 1, token_buckets: tuple[int, ...] = DEFAULT_TOKEN_BUCKETS
) -> ModelShapes:
    """The per-shard MoE shapes of the model described by the config.json at `path`. Raises ConfigInvalid
    (one line, naming the file) for a missing or unreadable file, bad JSON, an unsupported model_type, a
    missing or bad field, or a shard that does not divide the model."""
    path = Path(path)
    return _shapes(_read(path), str(path), tp=tp, ep=ep, token_buckets=token_buckets)


def _shapes(
    config: dict[str, Any], source: str, *, tp: int, ep: int, token_buckets: tuple[int, ...]
) -> ModelShapes:
    """load_hf_config's work on a config already read; `source` names it in errors."""
    path = source
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        what = "no model_type" if model_type is None else f"model_type {model_type!r} is not supported"
        raise ConfigInvalid(f"{path}: {what}; supported: {', '.join(FAMILIES)}")
    family = FAMILIES[model_type]
    fields = config
    if family.text_config:
        fields = config.get("text_config")
        if not isinstance(fields, dict):
            raise ConfigInvalid(
                f"{path}: a {model_type} config keeps its decoder in text_config; it has none"
            )
    read = _Reader(path, model_type, fields)
    top_k_field = next((name for name in family.top_k if name in fields), family.top_k[0])
    shared = None
    if family.shared_count is not None:
        count = (
            family.shared_count if isinstance(family.shared_count, int) else read.count(family.shared_count)
        )
        ffn = read.count(family.shared_ffn)
        if count and ffn:
            shared = SharedExperts(count=count, ffn=ffn)
    dtype = read.dtype(
        fields.get("torch_dtype") or fields.get("dtype") or config.get("torch_dtype") or "bfloat16"
    )
    return ModelShapes(
        name=_name(config, model_type, tp, ep),
        experts=read.positive(family.experts),
        top_k=read.positive(top_k_field),
        hidden=read.positive("hidden_size"),
        ffn=read.positive(family.ffn),
        lhs_dtype=dtype,
        rhs_dtype=dtype,
        out_dtype=dtype,
        token_buckets=tuple(token_buckets),
        activation=family.activation or read.activation(),
        shared_experts=shared,
        tp=tp,
        ep=ep,
    )


# A model's config.json is a few kB (DeepSeek-V3's: 1.7 kB); the cap leaves room for label maps.
MAX_HF_CONFIG_BYTES = 1 << 20


def _read(path: Path) -> dict[str, Any]:
    data = read_input_file(path, limit=MAX_HF_CONFIG_BYTES, what="--hf-config file", error=ConfigInvalid)
    try:
        config = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigInvalid(f"{path}: not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ConfigInvalid(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    except RecursionError:
        raise ConfigInvalid(f"{path}: JSON nested too deeply") from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise ConfigInvalid(f"{path}: not valid JSON ({' '.join(str(e).split())})") from None
    if not isinstance(config, dict):
        raise ConfigInvalid(f"{path}: a config.json holds one object; this holds a {type(config).__name__}")
    return config


@dataclasses.dataclass(frozen=True)
class _Reader:
    """Typed reads of one config's fields, each failure naming the file, the family and the field."""

    path: str
    model_type: str
    fields: dict[str, Any]

    @property
    def where(self) -> str:
        return f"{self.path}: {self.model_type} config"

    def positive(self, name: str) -> int:
        if name not in self.fields:
            raise ConfigInvalid(f"{self.where} has no {name}")
        value = self.fields[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigInvalid(f"{self.where}: {name}={value!r} must be a positive integer")
        return value

    def count(self, name: str) -> int:
        """A count that may be absent or 0 (no shared experts)."""
        value = self.fields.get(name) or 0
        return 0 if value == 0 else self.positive(name)

    def dtype(self, value: Any) -> str:
        try:
            return dtype_name(str(value))
        except ConfigInvalid as e:
            raise ConfigInvalid(f"{self.where}: torch_dtype {e}") from None

    def activation(self) -> str:
        act = self.fields.get("hidden_act", "silu")
        if act not in HIDDEN_ACTS:
            raise ConfigInvalid(
                f"{self.where}: hidden_act={act!r} is not a gated activation moetune tunes; "
                f"known: {', '.join(HIDDEN_ACTS)}"
            )
        return HIDDEN_ACTS[act]


def _name(config: dict[str, Any], model_type: str, tp: int, ep: int) -> str:
    """The label's name: the checkpoint's (its _name_or_path's last part) or the family's, with the shard."""
    base = str(config.get("_name_or_path") or "").rstrip("/").rsplit("/", 1)[-1] or model_type
    return base.lower().replace("_", "-") + (f"-tp{tp}" if tp > 1 else "") + (f"-ep{ep}" if ep > 1 else "")


def reference(path: str | Path, tp: int = 1, ep: int = 1) -> str:
    """How a sweep's `models` names this config sharded so: "hf:tp=2,ep=8:/abs/path/config.json"."""
    return f"{PREFIX}tp={tp},ep={ep}:{Path(path).resolve()}"


# The fields any family reads (beside its Family's own): what `embedded` keeps of a config.
COMMON_FIELDS = (
    "model_type",
    "_name_or_path",
    "torch_dtype",
    "dtype",
    "hidden_size",
    "hidden_act",
    "num_experts_per_tok",
    "experts_per_token",
)


def _essential(config: dict[str, Any]) -> dict[str, Any]:
    """The fields of `config` that its family reads (all of them where the model_type is unknown, so
    that the job's check fails as the file's would)."""
    family = FAMILIES.get(config.get("model_type"))  # type: ignore[arg-type]
    if family is None:
        return config
    names = set(COMMON_FIELDS) | {family.experts, family.ffn, *family.top_k}
    names |= {n for n in (family.shared_count, family.shared_ffn) if isinstance(n, str)}
    kept = {k: v for k, v in config.items() if k in names}
    if family.text_config and isinstance(config.get("text_config"), dict):
        kept["text_config"] = {k: v for k, v in config["text_config"].items() if k in names}
    return kept


def embedded(path: str | Path, tp: int = 1, ep: int = 1) -> str:
    """A `reference` that carries the config instead of naming its file: "hf:tp=1,ep=8:{...JSON...}",
    holding the fields its family reads. A queued job stores this, so the worker that runs it needs no
    copy of the file."""
    config = _read(Path(path))
    text = json.dumps(_essential(config), separators=(",", ":"), sort_keys=True)
    return f"{PREFIX}tp={tp},ep={ep}:{text}"


def load_reference(name: str) -> ModelShapes:
    """The ModelShapes of a `reference` or `embedded` string (ConfigInvalid for a malformed one)."""
    options, sep, path = name.removeprefix(PREFIX).partition(":")
    shards: dict[str, int] = {}
    for item in filter(None, options.split(",")):
        key, _, value = item.partition("=")
        if key not in ("tp", "ep") or not value.isdigit():
            raise ConfigInvalid(f"model {name!r}: expected hf:tp=N,ep=N:PATH")
        shards[key] = int(value)
    if not sep or not path:
        raise ConfigInvalid(f"model {name!r}: expected hf:tp=N,ep=N:PATH")
    if path.startswith("{"):  # embedded: the config itself
        try:
            config = json.loads(path)
        except (ValueError, RecursionError):
            raise ConfigInvalid("an embedded hf: config is not JSON") from None
        if not isinstance(config, dict):
            raise ConfigInvalid("an embedded hf: config must be a JSON object")
        where = f"embedded {config.get('_name_or_path') or config.get('model_type') or 'hf'} config"
        return _shapes(
            config,
            str(where),
            tp=shards.get("tp", 1),
            ep=shards.get("ep", 1),
            token_buckets=DEFAULT_TOKEN_BUCKETS,
        )
    return load_hf_config(path, **shards)
