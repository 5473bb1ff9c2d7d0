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
Any MoE model works from its YAML alone; nothing here knows a model by name.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
from pathlib import Path
from typing import Any

import yaml

from moetune.kernels import ops
from moetune.kernels.errors import ConfigInvalid, Unsupported
from moetune.kernels.moe.reference import GATES
from moetune.kernels.problem import GROUPED_MATMUL, Problem, dtype_name

OP = GROUPED_MATMUL
# Decode (1 token) to long prefill chunks (16384 tokens).
DEFAULT_TOKEN_BUCKETS = tuple(2**i for i in range(15))


@dataclasses.dataclass(frozen=True)
class PlannedProblem:
    """One Problem of a sweep and a label people can read ("mixtral-8x7b gate_up T=4096")."""

    problem: Problem
    label: str

    def to_dict(self) -> dict[str, Any]:
        return {"problem": self.problem.to_dict(), "label": self.label}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlannedProblem:
        return cls(Problem.from_dict(data["problem"]), str(data["label"]))


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

    def __post_init__(self) -> None:
        for name in ("experts", "top_k", "hidden", "ffn"):
            _positive_int(f"{self.name}: {name}", getattr(self, name))
        if self.activation not in GATES:
            raise ConfigInvalid(
                f"{self.name}: activation={self.activation!r}; known: {', '.join(sorted(GATES))}"
            )
        if self.top_k > self.experts:
            raise ConfigInvalid(f"{self.name}: top_k={self.top_k} exceeds experts={self.experts}")
        if not self.token_buckets:
            raise ConfigInvalid(f"{self.name}: token_buckets is empty")
        for tokens in self.token_buckets:
            _positive_int(f"{self.name}: token bucket", tokens)
        object.__setattr__(self, "token_buckets", tuple(sorted(set(self.token_buckets))))

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
                data[name] = dtype_name(str(data[name]))
        if "token_buckets" in data:
            buckets = data["token_buckets"]
            if not isinstance(buckets, list):
                raise ConfigInvalid(f"{source}: token_buckets must be a list of token counts")
            data["token_buckets"] = tuple(buckets)
        return cls(**data)

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
                ("gate_up", gate_up_op, self.hidden, 2 * self.ffn),
                ("down", OP, self.ffn, self.hidden),
            ):
                problem = Problem(
                    op,
                    m=m,
                    k=k,
                    n=n,
                    g=self.experts,
                    lhs_dtype=self.lhs_dtype,
                    rhs_dtype=self.rhs_dtype,
                    out_dtype=self.out_dtype,
                    transpose_rhs=self.transpose_rhs,
                )
                planned.append(PlannedProblem(problem, f"{self.name} {part} T={tokens}"))
        return planned


def _positive_int(what: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigInvalid(f"{what}={value!r} must be a positive integer")


def shipped_model_names() -> list[str]:
    root = importlib.resources.files("moetune.configs") / "models"
    return sorted(e.name.removesuffix(".yaml") for e in root.iterdir() if e.name.endswith(".yaml"))


def load_model(name_or_path: str) -> ModelShapes:
    """A model from a YAML path, or by the name of a file shipped in configs/models/."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        try:
            text = path.read_text()
        except OSError as e:
            raise ConfigInvalid(f"cannot read model file {path}: {e.strerror}") from e
        source = str(path)
    else:
        entry = importlib.resources.files("moetune.configs") / "models" / f"{name_or_path}.yaml"
        if not entry.is_file():
            raise ConfigInvalid(
                f"unknown model {name_or_path!r}; shipped models: {', '.join(shipped_model_names())} "
                "(or pass a path to a YAML file)"
            )
        text = entry.read_text()
        source = f"configs/models/{name_or_path}.yaml"
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigInvalid(f"{source}: not valid YAML ({e})") from e
    return ModelShapes.from_dict(data, source)


_PROBLEM_FIELDS = {"m": "m", "k": "k", "n": "n", "g": "g", "lhs": "lhs_dtype", "rhs": "rhs_dtype"}
_PROBLEM_FIELDS |= {"out": "out_dtype", "t": "transpose_rhs", "transpose_rhs": "transpose_rhs"}


def parse_problem(text: str) -> PlannedProblem:
    """'m=8192,k=4096,n=28672,g=8,dtype=bf16' -> a Problem; dtype sets lhs, rhs and out (each overridable);
    `op=grouped_matmul_swiglu` names another registered op (default: the plain grouped_matmul)."""
    values: dict[str, Any] = {}
    dtype = None
    op = OP
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep:
            raise ConfigInvalid(f"problem {text!r}: {item!r} is not name=value")
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
    for name in ("m", "k", "n", "g"):
        try:
            values[name] = int(values[name])
        except ValueError:
            raise ConfigInvalid(f"problem {text!r}: {name}={values[name]!r} is not an integer") from None
    if "transpose_rhs" in values:
        values["transpose_rhs"] = values["transpose_rhs"].lower() in ("1", "true", "yes")
    for name in ("lhs_dtype", "rhs_dtype", "out_dtype"):
        if dtype is not None:
            values.setdefault(name, dtype)
    problem = Problem(op, **values)
    label = f"m={problem.m},k={problem.k},n={problem.n},g={problem.g}"
    return PlannedProblem(problem, label if op == OP else f"{op} {label}")


def for_backend(planned: PlannedProblem, backend: Any) -> PlannedProblem:
    """The problem as moe_mlp dispatches it on `backend`: a fused gate_up op the backend does not serve
    becomes the plain GEMM of the same shape (the activation then runs in XLA)."""
    problem = planned.problem
    if not problem.spec.epilogue:  # nothing fused, nothing to unfuse
        return planned
    try:
        backend.check(problem)
    except Unsupported:
        return PlannedProblem(dataclasses.replace(problem, op=OP), planned.label)
    return planned


def dispatched_on(planned: list[PlannedProblem], backend: Any) -> list[PlannedProblem]:
    """Every problem as moe_mlp dispatches it on `backend` (`for_backend`), repeats dropped (`dedupe`)."""
    return dedupe([for_backend(p, backend) for p in planned])


def dedupe(planned: list[PlannedProblem]) -> list[PlannedProblem]:
    """Drop repeated Problems (two models may share a shape), keeping the first label."""
    seen: dict[Problem, PlannedProblem] = {}
    for item in planned:
        seen.setdefault(item.problem, item)
    return list(seen.values())
