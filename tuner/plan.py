"""What a sweep tunes: MoE model shape files and single-problem strings -> the Problems to tune.

A model file (configs/models/<name>.yaml) names the expert shapes; each token bucket T yields two
grouped GEMMs, because a gated expert multiplies twice:

    gate_up: M = T * top_k, K = hidden, N = 2 * ffn     (gate and up projections in one GEMM)
    down:    M = T * top_k, K = ffn,    N = hidden

They are the Problems `moetune.kernels.moe_mlp` dispatches, so the winners are the ones it looks up:
gate_up is the op whose epilogue is the model's activation ("grouped_matmul_swiglu" for `activation:
swiglu`, the default: the GEMM with silu(gate) * up in its epilogue) on every backend that serves that
op (`for_backend` turns it back into the plain GEMM where the backend does not, as moe_mlp does).

Example: Mixtral-8x7B at T=4096 -> gate_up m=8192,k=4096,n=28672,g=8 and down m=8192,k=14336,n=4096,g=8.
Any MoE model works from its YAML alone (or from a Hugging Face config.json: tuner/hf_config.py); nothing
here knows a model by name.

Training (`with_backward`, `moetune tune --with-backward`) adds each problem's backward (`with_backward`):
dlhs, the grouped GEMM with the other rhs layout (k and n swapped), drhs, the weight gradient
(grouped_matmul_drhs, [g, k, n]), and for a gated gate_up its float32 product, which the backward
recomputes; each its own key, as the custom VJP dispatches them.

FP8 experts (`as_fp8`, `moetune tune --fp8 LAYOUT`): each GEMM becomes its FP8 op on e4m3 operands with
float32 scales in the scale layout given and K-major weights, the problems `moe_mlp(...,
scale_layout=LAYOUT, transpose_weights=True)` dispatches (gate_up: grouped_matmul_swiglu_fp8; down:
grouped_matmul_fp8).

The fused MoE decode block (`decode_block_problems`, `moetune tune --decode-block`) adds one problem per
decode bucket (T <= 32 tokens): the op "moe_decode_block", m = T tokens, k = hidden, n = 2 * ffn, g = experts
and the model's top_k, which moe_mlp looks up to decide whether the block beats the two GEMMs at that T.
On FP8 experts (`as_fp8`) it is "moe_decode_block_fp8": x and the output stay in the model's dtype, the
weights are e4m3 with scales in the layout given, K-major.

Sharded models are tuned per shard, the problems one GPU runs:
  * `tp: N` (tensor parallel) splits each expert's ffn N ways: gate_up N = 2 * ffn / tp, down K = ffn / tp.
    Every TP rank computes all of its tokens' rows, so M stays T * top_k.
  * `ep: N` (expert parallel) gives each shard experts / N of the experts: G = experts / ep. Token buckets
    then count the tokens each shard holds (its attention's batch, T): the global batch is ep * T tokens,
    whose ep * T * top_k rows the all-to-all spreads over the ep shards, so a shard receives on average
    T * top_k rows (M = T * top_k, as unsharded), each of its experts ep * T * top_k / experts of them.
    Example, DeepSeek-V3 at EP=8 and T=512 tokens per shard: 4096 tokens in all, 32768 rows, a shard's
    32 experts receive 4096 of them (128 each).
`shared_experts` (count, ffn) are dense experts every token goes through beside the routed ones. Their GEMMs
are plain dense GEMMs ([T, H] x [H, 2 * count * ffn / tp] and back), not grouped ones: moetune does not tune
them (no Problem is planned for them; XLA's dense GEMM runs them). Under EP they are replicated, each shard
running them on its own T tokens; under TP their ffn is split as the routed experts' is.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from moetune.kernels import ops
from moetune.kernels.api import cotangent_problems
from moetune.kernels.errors import ConfigInvalid, Unsupported
from moetune.kernels.moe.reference import GATES
from moetune.kernels.problem import FP8_DTYPES, GROUPED_MATMUL, OPERAND_DTYPES, Problem, dtype_name
from moetune.kernels.typed_fields import INT32_MAX, check_fields, describe
from moetune.tuner.yaml_files import load_yaml, read_yaml_file

OP = GROUPED_MATMUL
BLOCK_OP = "moe_decode_block"
FP8_BLOCK_OP = "moe_decode_block_fp8"  # the block on FP8 experts (`as_fp8`)
# Gated activations moe_mlp does not compute but whose models are tuned all the same, their gate_up as the
# plain GEMM that a model's own layer would dispatch before applying it: gpt-oss's SwiGLU with clamped
# inputs, a sigmoid gain of 1.702 and (up + 1) (moetune's fused epilogue computes silu(gate) * up).
UNFUSED_ONLY_ACTIVATIONS = ("clamped_swiglu",)
ACTIVATIONS = (*sorted(GATES), *UNFUSED_ONLY_ACTIVATIONS)
# Decode (1 token) to long prefill chunks (16384 tokens).
DEFAULT_TOKEN_BUCKETS = tuple(2**i for i in range(15))
# A model's name labels its problems in tables and sweep records.
NAME_LENGTH = 64


@dataclasses.dataclass(frozen=True)
class PlannedProblem:
    """One Problem of a sweep and a label people can read ("mixtral-8x7b gate_up T=4096"); `tokens` is
    T, the tokens whose T * top_k rows are the problem's m, when a model planned it (None for a bare
    --problem, whose m alone is known). `filled_rows`: the rows the groups hold when fewer than m, as in
    a receive buffer sized for the worst case or a batch padded to a kernel's tile (the sweep's routings
    then spread that many rows and leave the rest past sum(group_sizes)); None: all m."""

    problem: Problem
    label: str
    tokens: int | None = None
    filled_rows: int | None = None

    def __post_init__(self) -> None:
        rows = self.filled_rows
        if rows is not None and (
            isinstance(rows, bool) or not isinstance(rows, int) or not 0 < rows <= self.problem.m
        ):
            raise ConfigInvalid(
                f"{self.label}: filled_rows={rows!r} must be between 1 and m={self.problem.m}"
            )

    @property
    def rows(self) -> int:
        """The rows the sweep's routings spread over the groups: m, or the filled rows, or for an op that
        routes its tokens itself each token's top_k choices (OpSpec.routing_rows)."""
        return self.problem.spec.routing_rows(self.problem) if self.filled_rows is None else self.filled_rows

    def to_dict(self) -> dict[str, Any]:
        data = {"problem": self.problem.to_dict(), "label": self.label}
        if self.tokens is not None:
            data["tokens"] = self.tokens
        return data if self.filled_rows is None else data | {"filled_rows": self.filled_rows}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlannedProblem:
        tokens = data.get("tokens")  # sweeps stored before tokens were recorded have none
        known = isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0
        problem = Problem.from_dict(data["problem"])
        return cls(problem, str(data["label"]), tokens if known else None, data.get("filled_rows"))


@dataclasses.dataclass(frozen=True)
class SharedExperts:
    """`count` dense SwiGLU experts of `ffn` each that every token goes through (not tuned: see above)."""

    count: int
    ffn: int

    @classmethod
    def from_dict(cls, data: Any, source: str) -> SharedExperts:
        if not isinstance(data, dict) or set(data) != {"count", "ffn"}:
            raise ConfigInvalid(f"{source}: shared_experts must be a mapping of count and ffn; got {data!r}")
        for name in ("count", "ffn"):
            _positive_int(f"{source}: shared_experts.{name}", data[name])
        return cls(count=data["count"], ffn=data["ffn"])


@dataclasses.dataclass(frozen=True)
class ModelShapes:
    name: str
    experts: int
    top_k: int
    hidden: int
    ffn: int
    lhs_dtype: str = "bfloat16"
    rhs_dtype: str = "bfloat16"
    out_dtype: str = "bfloat16"
    transpose_rhs: bool = False
    token_buckets: tuple[int, ...] = DEFAULT_TOKEN_BUCKETS
    activation: str = "swiglu"
    shared_experts: SharedExperts | None = None
    tp: int = 1  # tensor parallel: each expert's ffn split tp ways
    ep: int = 1  # expert parallel: the experts split ep ways; token buckets count one shard's tokens

    def __post_init__(self) -> None:
        if isinstance(self.token_buckets, list):
            object.__setattr__(self, "token_buckets", tuple(self.token_buckets))
        try:  # every field its annotated type, strictly, numbers bounded (typed_fields)
            check_fields(self, text_length=NAME_LENGTH)
        except ValidationError as e:
            raise ConfigInvalid(describe(e, dataclasses.asdict(self))) from None
        if not self.name.strip():
            raise ConfigInvalid("a model's name must not be empty")
        for name in ("experts", "top_k", "hidden", "ffn", "tp", "ep"):
            _positive_int(f"{self.name}: {name}", getattr(self, name))
        if self.activation not in ACTIVATIONS:
            raise ConfigInvalid(
                f"{self.name}: activation={self.activation!r}; known: {', '.join(ACTIVATIONS)}"
            )
        if self.top_k > self.experts:
            raise ConfigInvalid(f"{self.name}: top_k={self.top_k} exceeds experts={self.experts}")
        if self.ffn % self.tp:
            raise ConfigInvalid(f"{self.name}: ffn={self.ffn} is not divisible by tp={self.tp}")
        if self.experts % self.ep:
            raise ConfigInvalid(f"{self.name}: experts={self.experts} is not divisible by ep={self.ep}")
        if self.shared_experts is not None and self.shared_experts.ffn % self.tp:
            raise ConfigInvalid(
                f"{self.name}: shared_experts ffn={self.shared_experts.ffn} is not divisible by tp={self.tp}"
            )
        if not self.token_buckets:
            raise ConfigInvalid(f"{self.name}: token_buckets is empty")
        for tokens in self.token_buckets:
            _positive_int(f"{self.name}: token bucket", tokens)
        object.__setattr__(self, "token_buckets", tuple(sorted(set(self.token_buckets))))

    @property
    def local_experts(self) -> int:
        """The experts one shard holds: G of its grouped GEMMs."""
        return self.experts // self.ep

    @property
    def shard_ffn(self) -> int:
        """Each expert's ffn on one shard."""
        return self.ffn // self.tp

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<model>") -> ModelShapes:
        if not isinstance(data, dict):
            raise ConfigInvalid(f"{source}: a model file must be a mapping")
        data = dict(data)
        known = {f.name for f in dataclasses.fields(cls)} | {"dtype"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigInvalid(
                f"{source}: unknown model fields {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        missing = sorted({"name", "experts", "top_k", "hidden", "ffn"} - set(data))
        if missing:
            raise ConfigInvalid(f"{source}: missing model fields {', '.join(missing)}")
        # `dtype` sets all three dtypes; the specific fields override it.
        dtype = data.pop("dtype", None)
        if dtype is not None:
            for name in ("lhs_dtype", "rhs_dtype", "out_dtype"):
                data.setdefault(name, dtype)
        for name in ("lhs_dtype", "rhs_dtype", "out_dtype"):
            if name in data:
                try:
                    data[name] = dtype_name(str(data[name]))
                except ConfigInvalid as e:
                    raise ConfigInvalid(f"{source}: {name}: {e}") from None
        if "token_buckets" in data:
            buckets = data["token_buckets"]
            if not isinstance(buckets, list):
                raise ConfigInvalid(f"{source}: token_buckets must be a list of token counts")
            data["token_buckets"] = tuple(buckets)
        if data.get("shared_experts") is not None:
            data["shared_experts"] = SharedExperts.from_dict(data["shared_experts"], source)
        try:
            return cls(**data)
        except ConfigInvalid as e:
            raise ConfigInvalid(f"{source}: {e}") from None

    def with_buckets(self, buckets: tuple[int, ...]) -> ModelShapes:
        return dataclasses.replace(self, token_buckets=tuple(buckets))

    def problems(self) -> list[PlannedProblem]:
        planned = []
        for tokens in self.token_buckets:
            m = tokens * self.top_k
            # The gate_up op moe_mlp dispatches: the one fusing the activation, else the plain GEMM.
            fused = ops.fusing(self.activation)
            gate_up_op = OP if fused is None else fused.name
            for part, op, k, n in (
                ("gate_up", gate_up_op, self.hidden, 2 * self.shard_ffn),
                ("down", OP, self.shard_ffn, self.hidden),
            ):
                _stored_size(f"{self.name} {part} T={tokens}", m=m, k=k, n=n)
                problem = Problem(
                    op,
                    m=m,
                    k=k,
                    n=n,
                    g=self.local_experts,
                    lhs_dtype=self.lhs_dtype,
                    rhs_dtype=self.rhs_dtype,
                    out_dtype=self.out_dtype,
                    transpose_rhs=self.transpose_rhs,
                )
                planned.append(PlannedProblem(problem, f"{self.name} {part} T={tokens}", tokens))
        return planned


def decode_block_problems(model: ModelShapes) -> list[PlannedProblem]:
    """The fused MoE decode block's problems of `model` (op moe_decode_block, m = T tokens), one per token
    bucket the block serves (T <= decode_block.MAX_TOKENS): what moe_mlp looks up before it runs the
    block at decode sizes. None for a model the block does not run: an activation other than SwiGLU,
    experts of more than one dtype, or experts split across shards (ep > 1: the block's winners are for
    whole layers); a TP shard's block has the shard's F."""
    from moetune.kernels.moe import decode_block

    dtypes = {model.lhs_dtype, model.rhs_dtype, model.out_dtype}
    if model.activation != "swiglu" or len(dtypes) != 1 or model.ep != 1:
        return []
    planned = []
    for tokens in (t for t in model.token_buckets if t <= decode_block.MAX_TOKENS):
        problem = Problem(
            BLOCK_OP, m=tokens, k=model.hidden, n=2 * model.shard_ffn, g=model.experts, top_k=model.top_k,
            lhs_dtype=model.lhs_dtype, rhs_dtype=model.rhs_dtype, out_dtype=model.out_dtype,
        )  # fmt: skip
        planned.append(PlannedProblem(problem, f"{model.name} block T={tokens}", tokens))
    return planned


def _positive_int(what: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigInvalid(f"{what}={value!r} must be a positive integer")


def _stored_size(what: str, **dims: int) -> None:
    """A problem's dimensions are stored in 32-bit Integer columns (PostgreSQL's integer)."""
    for name, value in dims.items():
        if value > INT32_MAX:
            raise ConfigInvalid(f"{what}: {name}={value} exceeds {INT32_MAX}, the largest dimension stored")


def shipped_model_names() -> list[str]:
    root = importlib.resources.files("moetune.configs") / "models"
    return sorted(e.name.removesuffix(".yaml") for e in root.iterdir() if e.name.endswith(".yaml"))


def load_model(name_or_path: str) -> ModelShapes:
    """A model from a YAML path, by the name of a file shipped in configs/models/, or from a Hugging Face
    config.json named as tuner/hf_config.py's `reference` writes it ("hf:tp=1,ep=8:PATH")."""
    from moetune.tuner import hf_config  # it builds on this module

    if name_or_path.startswith(hf_config.PREFIX):
        return hf_config.load_reference(name_or_path)
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        source = str(path)
        data = read_yaml_file(path, "model file")
    else:
        entry = importlib.resources.files("moetune.configs") / "models" / f"{name_or_path}.yaml"
        if not _shipped_name(name_or_path) or not entry.is_file():
            raise ConfigInvalid(
                f"unknown model {name_or_path!r}; shipped models: {', '.join(shipped_model_names())} "
                "(or pass a path to a YAML file)"
            )
        source = f"configs/models/{name_or_path}.yaml"
        data = load_yaml(entry.read_bytes(), source)
    return ModelShapes.from_dict(data, source)


def _shipped_name(name: str) -> bool:
    # A name, not a path: "../x" must not reach outside configs/models/.
    return (
        bool(name) and name.isprintable() and "/" not in name and "\\" not in name and name not in (".", "..")
    )


_PROBLEM_FIELDS = {"m": "m", "k": "k", "n": "n", "g": "g", "lhs": "lhs_dtype", "rhs": "rhs_dtype"}
_PROBLEM_FIELDS |= {"out": "out_dtype", "t": "transpose_rhs", "transpose_rhs": "transpose_rhs"}
_PROBLEM_FIELDS |= {"s": "scale_layout", "scale_layout": "scale_layout", "top_k": "top_k"}
_FLAGS = {"0": False, "1": True, "false": False, "true": True, "no": False, "yes": True}


def parse_problem(text: str) -> PlannedProblem:
    """'m=8192,k=4096,n=28672,g=8,dtype=bf16' -> a Problem; dtype sets lhs, rhs and out (each overridable);
    `op=grouped_matmul_swiglu` names another registered op (default: the plain grouped_matmul). An FP8
    problem names its op, its operands' dtype and its scales, as its key does:
    'op=grouped_matmul_fp8,m=4096,k=7168,n=4096,g=256,dtype=e4m3,s=block_1x128_128x128'; an FP8 dtype
    sets the operands only, the output staying bfloat16 unless `out` says otherwise. An op routing its
    tokens itself names its top_k, as its key does: 'op=moe_decode_block,m=8,k=2048,n=1536,g=128,top_k=8'
    (m is T tokens there)."""
    values: dict[str, Any] = {}
    dtype = None
    op = OP
    given: dict[str, str] = {}  # field -> the name it was given by (t and transpose_rhs are one field)
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep:
            raise ConfigInvalid(f"problem {text!r}: {item!r} is not name=value")
        field = _PROBLEM_FIELDS.get(name, name)
        if field in given:
            raise ConfigInvalid(f"problem {text!r}: {name} is given twice (as {given[field]} before)")
        given[field] = name
        if name == "dtype":
            dtype = value.strip()
        elif name == "op":
            op = value.strip()
            if op not in ops.names():
                raise ConfigInvalid(f"problem {text!r}: op={op!r}; known: {', '.join(ops.names())}")
        elif name in _PROBLEM_FIELDS:
            values[_PROBLEM_FIELDS[name]] = value.strip()
        else:
            raise ConfigInvalid(
                f"problem {text!r}: unknown field {name!r}; known: op, dtype, {', '.join(_PROBLEM_FIELDS)}"
            )
    missing = [name for name in ("m", "k", "n", "g") if name not in values]
    if missing:
        raise ConfigInvalid(f"problem {text!r}: missing {', '.join(missing)}")
    for name in ("m", "k", "n", "g", "top_k"):
        if name not in values:
            continue
        digits = values[name]
        if not (digits.isascii() and digits.isdigit()) or len(digits) > len(str(INT32_MAX)):
            raise ConfigInvalid(f"problem {text!r}: {name}={digits!r} is not a positive integer")
        values[name] = int(digits)
    _stored_size(f"problem {text!r}", **{name: values[name] for name in ("m", "k", "n", "g")})
    if "transpose_rhs" in values:
        flag = values["transpose_rhs"].lower()
        if flag not in _FLAGS:
            raise ConfigInvalid(
                f"problem {text!r}: t={values['transpose_rhs']!r} is not one of {', '.join(_FLAGS)}"
            )
        values["transpose_rhs"] = _FLAGS[flag]
    try:
        fp8 = dtype is not None and dtype_name(dtype, OPERAND_DTYPES) in FP8_DTYPES
        for name in ("lhs_dtype", "rhs_dtype") if fp8 else ("lhs_dtype", "rhs_dtype", "out_dtype"):
            if dtype is not None:
                values.setdefault(name, dtype)
        problem = Problem(op, **values)
    except ConfigInvalid as e:
        raise ConfigInvalid(f"problem {text!r}: {e}") from None
    label = f"m={problem.m},k={problem.k},n={problem.n},g={problem.g}"
    if problem.scale_layout != "none":
        label += f",{problem.lhs_dtype},s={problem.scale_layout}"
    if problem.top_k:
        label += f",top_k={problem.top_k}"
    return PlannedProblem(problem, label if op == OP else f"{op} {label}")


def for_backend(planned: PlannedProblem, backend: Any) -> PlannedProblem:
    """The problem as moe_mlp dispatches it on `backend`: a fused gate_up op the backend does not serve
    becomes the plain GEMM of the same shape (the activation then runs in XLA; an FP8 layer's plain GEMM
    writes its product in float32 for it, as kernels/moe/fp8.py calls it)."""
    problem = planned.problem
    if not problem.spec.epilogue:  # nothing fused, nothing to unfuse
        return planned
    try:
        backend.check(problem)
    except Unsupported:
        if problem.scale_layout != "none":
            plain = dataclasses.replace(problem, op=FP8_OPS[OP], out_dtype="float32")
        else:
            plain = dataclasses.replace(problem, op=OP)
        return dataclasses.replace(planned, problem=plain)
    return planned


# The FP8 op of each op a model's layer dispatches.
FP8_OPS = {GROUPED_MATMUL: ops.GROUPED_MATMUL_FP8, ops.GROUPED_MATMUL_SWIGLU: ops.GROUPED_MATMUL_SWIGLU_FP8}
FP8_EXPERT_DTYPE = "float8_e4m3fn"


def as_fp8(planned: list[PlannedProblem], scale_layout: str) -> list[PlannedProblem]:
    """The problems of a model on FP8 experts (module docstring): e4m3 operands, `scale_layout`, K-major
    weights, a bf16 output (the decode block: e4m3 weights only). ConfigInvalid for an op without an FP8
    form or a shape the layout cannot cover (block scales need K and N in whole 128-blocks)."""
    out = []
    for item in planned:
        p = item.problem
        if p.op not in FP8_OPS and p.op != BLOCK_OP:
            raise ConfigInvalid(
                f"{item.label}: op={p.op} has no FP8 form; FP8 experts run {', '.join(FP8_OPS.values())}"
            )
        # The fused decode block keeps x and its output in their dtype: only its weights are FP8.
        operands = (
            dict(op=FP8_BLOCK_OP, rhs_dtype=FP8_EXPERT_DTYPE)
            if p.op == BLOCK_OP
            else dict(
                op=FP8_OPS[p.op], lhs_dtype=FP8_EXPERT_DTYPE, rhs_dtype=FP8_EXPERT_DTYPE, out_dtype="bfloat16"
            )
        )
        try:  # a Problem checks itself against its op's rules
            fp8 = dataclasses.replace(p, transpose_rhs=True, scale_layout=scale_layout, **operands)
        except ConfigInvalid as e:
            raise ConfigInvalid(f"{item.label}: {e}") from None
        out.append(dataclasses.replace(item, problem=fp8, label=f"{item.label} fp8"))
    return out


def dispatched_on(planned: list[PlannedProblem], backend: Any) -> list[PlannedProblem]:
    """Every problem as moe_mlp dispatches it on `backend` (`for_backend`), repeats dropped (`dedupe`)."""
    return dedupe([for_backend(p, backend) for p in planned])


def dedupe(planned: list[PlannedProblem]) -> list[PlannedProblem]:
    """Drop repeated Problems (two models may share a shape), keeping the first label."""
    seen: dict[Problem, PlannedProblem] = {}
    for item in planned:
        seen.setdefault(item.problem, item)
    return list(seen.values())


def with_backward(planned: list[PlannedProblem]) -> list[PlannedProblem]:
    """Each problem followed by the problems its gradient dispatches (kernels.api.cotangent_problems:
    a gated op's recomputed product, dlhs and drhs, each its own key), labelled "<label> <part>";
    repeats dropped. ConfigInvalid for a problem whose op has no gradient (it is one already)."""
    expanded = []
    for item in planned:
        parts = cotangent_problems(item.problem)
        if not parts:
            raise ConfigInvalid(
                f"{item.label}: op={item.problem.op} has no backward to add (--with-backward); "
                "it is tuned as it is without the flag"
            )
        expanded.append(item)
        # Every cotangent GEMM keeps the forward's rows (drhs's are its contracting dimension).
        expanded += [
            PlannedProblem(p, f"{item.label} {part}", item.tokens, item.filled_rows) for part, p in parts
        ]
    return dedupe(expanded)
