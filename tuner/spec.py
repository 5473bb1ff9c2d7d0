"""A sweep's specification: what to tune and how, from a sweep file (configs/sweeps/*.yaml) and flags.

Flags override the file; the file overrides the defaults here. The resolved spec and the resolved
problem list are stored with the sweep, so `--resume` rebuilds exactly the same sweep even when the
model files, the misses or the stale winners have changed since.

Example sweep file:

    backend: mosaic_gpu
    models: [mixtral-8x7b]
    token_buckets: [1, 16, 256, 4096]
    strategy: tpe
    budget: 64
    routing: [balanced, zipf:1.2]    # each candidate timed on both; its time is their mean
    space: {block_k: [64, 128]}      # optional: narrower domains for some parameters
    maxtext: {config: base.yml, overrides: [model_name=qwen3-30b-a3b, ici_expert_parallelism=8]}
"""

from __future__ import annotations

import dataclasses
import importlib.resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.typed_fields import check_fields, describe
from moetune.tuner import strategies
from moetune.tuner.routing import parse_routings
from moetune.tuner.yaml_files import load_yaml, read_yaml_file

# Text fields (paths, URLs, routings, problem strings) are at most a path's length on Linux.
TEXT_LENGTH = 4096
# Where the sweep file came from is recorded in a String(1024) column (db/models.py Sweep.sweep_file).
SWEEP_FILE_LENGTH = 1024


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    # What to tune.
    backend: str = "auto"  # "auto": the highest-priority backend available on the workers' device
    models: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()  # "m=..,k=..,n=..,g=..,dtype=bf16"
    token_buckets: tuple[int, ...] = ()  # overrides the models' buckets when set
    misses: bool = False  # what dispatch missed (Store.misses)
    stale: bool = False  # winners whose fingerprint or kernel source no longer match
    # Also each model's and problem's backward: dlhs, drhs (and a gated op's product), for training.
    with_backward: bool = False
    # The models' expert GEMMs on FP8 experts with scales in this layout (plan.as_fp8); "none": as they are.
    fp8: str = "none"
    # Also the fused MoE decode block at each model's decode buckets (ModelShapes.decode_block_problems).
    decode_block: bool = False
    # The MoE GEMMs a MaxText config runs, traced from MaxText's own layer (moetune.integrations.maxtext:
    # problems.Target's fields: config, overrides, devices, workloads).
    maxtext: dict[str, Any] | None = None
    # How to search.
    strategy: str = "grid"
    budget: int | None = None  # trials per problem
    minutes: float | None = None  # wall clock for the whole sweep
    seed: int = 0
    # Narrower domains for some parameters, e.g. {"block_n": [128, 256]}; the rest keep the backend's.
    space: dict[str, Any] | None = None
    # How to measure.
    routing: str = "balanced"  # one routing or several, comma-separated (tuner/routing.py)
    timeout_s: float = 120.0
    runs: int = 10
    verify_draws: int = 2
    finalists: int = 3
    retime_rounds: int = 5
    min_gain: float = 0.02
    baseline: bool = True  # also time XLA's ragged_dot on every problem, for the speedup columns
    # Compile for `arch` without its device (Backend.compile_only): ok / pruned / compile_error, no times.
    compile_only: bool = False
    arch: str | None = None
    # Where.
    workers: int | None = None
    ray_address: str | None = None
    db: str | None = None

    def __post_init__(self) -> None:
        for name in ("models", "problems", "token_buckets"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        try:  # every field its annotated type, strictly, numbers bounded (typed_fields)
            check_fields(self, text_length=TEXT_LENGTH)
        except ValidationError as e:
            raise ConfigInvalid(describe(e, self.to_dict())) from None
        for name, value in (("budget", self.budget), ("workers", self.workers)):
            if value is not None and value < 1:
                raise ConfigInvalid(f"{name}={value!r} must be a positive integer")
        if self.seed < 0:  # numpy's and jax's seeds are unsigned
            raise ConfigInvalid(f"seed={self.seed} must be >= 0")
        if self.strategy not in strategies.names():
            raise ConfigInvalid(f"unknown strategy {self.strategy!r}; known: {', '.join(strategies.names())}")
        if self.minutes is not None and not self.minutes > 0:
            raise ConfigInvalid(f"minutes={self.minutes!r} must be positive")
        if not self.timeout_s > 0:
            raise ConfigInvalid(f"timeout_s={self.timeout_s!r} must be positive")
        if self.runs < 10:
            raise ConfigInvalid(f"runs={self.runs}: time at least 10 runs (the median of fewer is noise)")
        if self.verify_draws < 2:
            raise ConfigInvalid(f"verify_draws={self.verify_draws}: verify on at least two routing draws")
        if self.finalists < 1 or self.retime_rounds < 1:
            raise ConfigInvalid(
                f"finalists={self.finalists}, retime_rounds={self.retime_rounds} must be >= 1"
            )
        if not 0 <= self.min_gain < 1:
            raise ConfigInvalid(f"min_gain={self.min_gain!r} must be a fraction in [0, 1)")
        if self.space is not None and not isinstance(self.space, dict):
            raise ConfigInvalid(f"space={self.space!r} must be a mapping of parameter -> values")
        parse_routings(self.routing)  # a bad routing fails here, before anything is started or written
        if self.with_backward and not (self.models or self.problems):
            raise ConfigInvalid(
                "with_backward adds the backward of the models' and problems' GEMMs: name a model or a "
                "problem (missed and stale problems are tuned as they were recorded)"
            )
        if self.fp8 != "none":
            from moetune.kernels.ops import fp8_scales

            if self.fp8 not in fp8_scales.BLOCKS:
                raise ConfigInvalid(f"fp8={self.fp8!r} is not a scale layout: {', '.join(fp8_scales.BLOCKS)}")
            if not self.models:
                raise ConfigInvalid(
                    "fp8 puts the models' expert GEMMs on FP8 experts: name a model (a single problem "
                    "names its own dtype and s=LAYOUT)"
                )
            if self.with_backward:
                raise ConfigInvalid("the FP8 ops have no backward: drop with_backward or fp8")
        if self.decode_block:
            if not self.models:
                raise ConfigInvalid(
                    "decode_block adds the fused decode block at the models' decode buckets: name a model (a "
                    "single problem names its op: op=moe_decode_block,...,top_k=K)"
                )
            if self.with_backward:
                raise ConfigInvalid(
                    "the fused decode block serves the forward only: drop with_backward or decode_block"
                )
        if self.maxtext is not None:
            from moetune.integrations.maxtext.problems import Target

            Target.from_dict(self.maxtext, "maxtext")
        if self.compile_only and self.strategy == "tpe":
            raise ConfigInvalid("a compile-only sweep has no times for tpe to learn from; use grid or random")

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for name in ("models", "problems", "token_buckets"):
            data[name] = list(data[name])
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<sweep>") -> SweepSpec:
        if not isinstance(data, dict):
            raise ConfigInvalid(f"{source}: a sweep file must be a mapping")
        data = dict(data)
        # Singular spellings, as on the command line.
        for single, plural in (("model", "models"), ("problem", "problems")):
            if single in data:
                value = data.pop(single)
                data[plural] = list(data.get(plural, ())) + (
                    [value] if isinstance(value, str) else list(value)
                )
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigInvalid(
                f"{source}: unknown sweep fields {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        if isinstance(data.get("routing"), (list, tuple)):  # routing: [balanced, zipf:1.2]
            data["routing"] = ",".join(str(r) for r in data["routing"])
        for name in ("models", "problems", "token_buckets"):
            if name in data and not isinstance(data[name], (list, tuple)):
                raise ConfigInvalid(f"{source}: {name} must be a list")
        try:
            return cls(**data)
        except ConfigInvalid as e:
            raise ConfigInvalid(f"{source}: {e}") from None

    def override(self, **flags: Any) -> SweepSpec:
        """A copy with every flag that was given (not None, not an empty list) replacing the file's value."""
        given = {k: v for k, v in flags.items() if v is not None and v != () and v != []}
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise ConfigInvalid(f"unknown sweep settings {', '.join(unknown)}")
        return dataclasses.replace(self, **given)


def shipped_sweep_names() -> list[str]:
    root = importlib.resources.files("moetune.configs") / "sweeps"
    return sorted(e.name.removesuffix(".yaml") for e in root.iterdir() if e.name.endswith(".yaml"))


def load_sweep_file(name_or_path: str) -> tuple[SweepSpec, str]:
    """The spec in a sweep file (a path, or the name of one in configs/sweeps/) and where it came from."""
    path = Path(name_or_path)
    if path.exists():
        source = str(path.resolve())
        data = read_yaml_file(path, "sweep file")
    else:
        entry = importlib.resources.files("moetune.configs") / "sweeps" / f"{path.stem}.yaml"
        if not entry.is_file():
            raise ConfigInvalid(
                f"no sweep file {name_or_path!r}; shipped sweeps: {', '.join(shipped_sweep_names())}"
            )
        source = f"configs/sweeps/{path.stem}.yaml"
        data = load_yaml(entry.read_bytes(), source)
    if len(source) > SWEEP_FILE_LENGTH:
        raise ConfigInvalid(
            f"sweep file path of {len(source)} characters; the database records {SWEEP_FILE_LENGTH}"
        )
    return SweepSpec.from_dict(data or {}, source), source
