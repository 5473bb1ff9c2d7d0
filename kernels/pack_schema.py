"""The config pack format as pydantic models: what every field may hold, and the pack's JSON Schema.

moetune.kernels.packs validates a decoded pack with `PackModel` and then builds its frozen values (Pack,
Problem, DeviceFingerprint). configs/pack.schema.json is `json_schema()` written out: a test keeps the
two equal, and `moetune pack-schema` prints it.

Bounds are those of the database columns an imported pack lands in, on every dialect (db/models.py; a
test in tests/db holds the two together): Integer is 32-bit on PostgreSQL even where SQLite would take
any size, BigInteger 64-bit, String(N) at most N characters. Text never holds control characters.
Unknown fields are refused at every level.

The pack level types a config's values only (bounded numbers, bools, short strings): what a backend's
config may hold is `typed_config(config_cls, ...)`, which moetune.db.pack_io.check_pack applies.
Strictness, bounds and one-line errors are moetune.kernels.typed_fields'.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StringConstraints,
    WithJsonSchema,
)

from moetune.kernels import ops
from moetune.kernels.config import KernelConfig
from moetune.kernels.problem import DTYPES, OPERAND_DTYPES, SCALE_LAYOUTS, Problem
from moetune.kernels.typed_fields import (
    HASH_PATTERN,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    NAME_PATTERN,
    NO_CONTROL_CHARACTERS,
    TIMESTAMP_PATTERN,
    FiniteFloat,
    fields_model,
    text,
)

SCHEMA = "moetune.pack"
SCHEMA_VERSION = 1  # a pack of problems without scales: every pack written before FP8 ops, byte for byte
SCALED_SCHEMA_VERSION = 2  # a pack that holds a problem with FP8 operands and scales (Problem v2)
ROUTED_SCHEMA_VERSION = 3  # a pack that holds a problem of an op routing its tokens itself (Problem v3)
SCHEMA_VERSIONS = (SCHEMA_VERSION, SCALED_SCHEMA_VERSION, ROUTED_SCHEMA_VERSION)

# String(N) lengths of the columns the text lands in (db/models.py).
NAME_LENGTH = 64  # backend, op (String(64)); config parameter names and values, by the same measure
HASH_LENGTH = 64  # kernel source hash (String(64))
DEVICE_TEXT_LENGTHS = {
    "device_kind": 128,
    "platform": 32,
    "compute_capability": 32,
    "driver": 64,
    "runtime": 64,
    "jax_version": 32,
    "jaxlib_version": 32,
}
# A backend's Config has about a dozen parameters; more than this is not a config.
CONFIG_FIELDS_MAX = 64

Name = Annotated[str, StringConstraints(min_length=1, max_length=NAME_LENGTH, pattern=NAME_PATTERN)]
Dim = Annotated[int, Field(ge=1, le=INT32_MAX)]
DType = Literal[DTYPES]  # a Literal of the tuple's names
OperandDType = Literal[OPERAND_DTYPES]
ScaleLayout = Literal[SCALE_LAYOUTS[1:]]  # a v2 problem has scales: not "none"


def _known_op(op: str) -> str:
    if op not in ops.names():
        raise ValueError(f"op {op!r} is not one of {', '.join(ops.names())}")
    return op


def _real_time(value: str) -> str:
    datetime.datetime.fromisoformat(value)  # the pattern admits month 13; this does not
    return value


def _config_value(value: Any) -> Any:
    # One validator rather than a union: a union reports one error per member for a single bad value.
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not INT32_MIN <= value <= INT32_MAX:
            raise ValueError(f"{value} does not fit a 32-bit integer")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value} is not a finite number")
        return value
    if isinstance(value, str):
        if len(value) > NAME_LENGTH or not re.match(NO_CONTROL_CHARACTERS, value):
            raise ValueError(f"must be text of at most {NAME_LENGTH} characters, none a control character")
        return value
    raise ValueError(f"must be an integer, number, bool or string, not {type(value).__name__}")


ConfigValue = Annotated[
    Any,
    PlainValidator(_config_value),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": INT32_MIN, "maximum": INT32_MAX},
                {"type": "number"},
                {"type": "boolean"},
                {"type": "string", "maxLength": NAME_LENGTH, "pattern": NO_CONTROL_CHARACTERS},
            ]
        }
    ),
]


class _Strict(BaseModel):
    # strict: 1 is not True, "4096" is not 4096, 4096.0 is not 4096.
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class DeviceModel(_Strict):
    """moetune.kernels.device.DeviceFingerprint: the device the pack's winners were tuned on."""

    device_kind: text(DEVICE_TEXT_LENGTHS["device_kind"], min_length=1)
    platform: text(DEVICE_TEXT_LENGTHS["platform"])
    core_count: Annotated[int, Field(ge=0, le=INT32_MAX)]
    memory_bytes: Annotated[int, Field(ge=0, le=INT64_MAX)]
    compute_capability: text(DEVICE_TEXT_LENGTHS["compute_capability"])
    driver: text(DEVICE_TEXT_LENGTHS["driver"])
    runtime: text(DEVICE_TEXT_LENGTHS["runtime"])
    jax_version: text(DEVICE_TEXT_LENGTHS["jax_version"])
    jaxlib_version: text(DEVICE_TEXT_LENGTHS["jaxlib_version"])


class ProblemModel(_Strict):
    """moetune.kernels.problem.Problem, as Problem.to_dict writes it."""

    schema_version: Literal[Problem.SCHEMA_VERSION]
    op: Annotated[
        Name,
        AfterValidator(_known_op),
        Field(description="One of the ops this moetune knows (moetune.kernels.ops.names())."),
    ]
    m: Dim
    k: Dim
    n: Dim
    g: Dim
    lhs_dtype: DType
    rhs_dtype: DType
    out_dtype: DType
    transpose_rhs: bool


class ScaledProblemModel(ProblemModel):
    """A Problem with FP8 operands and float32 scales (schema_version 2): its operand dtypes may be FP8 and
    its scale layout is part of it."""

    schema_version: Literal[Problem.SCALED_SCHEMA_VERSION]
    lhs_dtype: OperandDType
    rhs_dtype: OperandDType
    scale_layout: ScaleLayout


class RoutedProblemModel(ProblemModel):
    """A Problem of an op that routes its tokens itself (schema_version 3: the fused MoE decode block),
    whose m is T tokens: the experts each token's router picks are part of it."""

    schema_version: Literal[Problem.ROUTED_SCHEMA_VERSION]
    top_k: Dim


class EntryModel(_Strict):
    """One winner: the problem, the backend's config for it, and its median time."""

    problem: Annotated[
        ProblemModel | ScaledProblemModel | RoutedProblemModel, Field(discriminator="schema_version")
    ]
    config: Annotated[
        dict[Name, ConfigValue],
        # Names outside the pattern are refused too (pydantic writes the pattern as patternProperties).
        Field(max_length=CONFIG_FIELDS_MAX, json_schema_extra={"additionalProperties": False}),
    ]
    median_s: Annotated[FiniteFloat, Field(gt=0)] | None


class PackModel(_Strict):
    """A moetune config pack: the winners of one backend on one device model."""

    model_config = ConfigDict(title="moetune config pack")

    schema_: Annotated[Literal[SCHEMA], Field(alias="schema")]
    schema_version: Literal[SCHEMA_VERSIONS]
    created: Annotated[
        str, StringConstraints(max_length=40, pattern=TIMESTAMP_PATTERN), AfterValidator(_real_time)
    ]
    device: DeviceModel
    backend: Name
    kernel_source_hash: Annotated[
        str, StringConstraints(min_length=1, max_length=HASH_LENGTH, pattern=HASH_PATTERN)
    ]
    entries: list[EntryModel]


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a config pack."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **PackModel.model_json_schema()}


def json_schema_text() -> str:
    """`json_schema()` as configs/pack.schema.json holds it and `moetune pack-schema` prints it."""
    return json.dumps(json_schema(), indent=2) + "\n"


def typed_config(config_cls: type[KernelConfig], data: Any) -> KernelConfig:
    """`data` as a `config_cls`: its own field types, strictly, ints 32-bit, floats finite, strings short
    and printable, no unknown field, missing fields at their defaults (as KernelConfig.from_dict).
    Raises ValidationError for a wrong type, the Config's own ConfigInvalid for a rule it breaks."""
    values = fields_model(config_cls, text_length=NAME_LENGTH).model_validate(data)
    return config_cls(**dict(values))
