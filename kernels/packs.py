"""Config packs: versioned JSON files of winners for one device model and backend, shipped in configs/tuned/.

A pack is plain data (never pickle), validated completely on load: every field is typed and bounded by
the pydantic models in moetune.kernels.pack_schema (configs/pack.schema.json is their JSON Schema).
Layout (schema_version 1; a pack that holds a problem with FP8 operands and scales, a Problem of
schema_version 2, is schema_version 2, and one that holds a problem of an op routing its tokens itself, a
Problem of schema_version 3 with its top_k, is schema_version 3: a pack's version is its newest problem's,
and a pack holds no problem newer than itself):

    {"schema": "moetune.pack", "schema_version": 1, "created": "2026-11-29T12:00:00Z",
     "device": {<DeviceFingerprint fields>}, "backend": "mosaic_gpu", "kernel_source_hash": "ab12...",
     "entries": [{"problem": {<Problem fields>}, "config": {<Config fields>}, "median_s": 0.00123}]}

Whether each config suits its backend is checked where the backend is known: moetune.db.pack_io.check_pack.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import ConfigInvalid, PackInvalid
from moetune.kernels.input_files import read_input_file
from moetune.kernels.pack_schema import SCHEMA, SCHEMA_VERSION, SCHEMA_VERSIONS, PackModel
from moetune.kernels.problem import Problem
from moetune.kernels.typed_fields import describe

# The shipped pack is ~24 kB for 38 winners: 16 MiB holds some 25,000, and no more is read into memory.
MAX_PACK_BYTES = 16 << 20


@dataclasses.dataclass(frozen=True)
class PackEntry:
    problem: Problem
    config: dict[str, Any]
    median_s: float | None = None


@dataclasses.dataclass(frozen=True)
class Pack:
    device: DeviceFingerprint
    backend: str
    kernel_source_hash: str
    entries: tuple[PackEntry, ...]
    created: str = ""

    @property
    def schema_version(self) -> int:
        """Its newest problem's version: 1 unless an entry's problem has scales (2) or a top_k (3), so a
        pack of bf16 winners reads as it always did."""
        return max((e.problem.schema_version for e in self.entries), default=SCHEMA_VERSION)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "schema_version": self.schema_version,
            "created": self.created or datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "device": self.device.to_dict(),
            "backend": self.backend,
            "kernel_source_hash": self.kernel_source_hash,
            "entries": [
                {"problem": e.problem.to_dict(), "config": e.config, "median_s": e.median_s}
                for e in self.entries
            ],
        }

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)


def file_name(device_kind: str, backend: str) -> str:
    """'NVIDIA H200', 'mosaic_gpu' -> 'nvidia_h200__mosaic_gpu.json'."""
    slug = re.sub(r"[^a-z0-9]+", "_", device_kind.lower()).strip("_")
    return f"{slug}__{backend}.json"


def parse(data: Any, source: str = "<pack>") -> Pack:
    """Validate a decoded pack; raises PackInvalid naming the first problem found."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise PackInvalid(f"{source}: not a moetune config pack (schema is not {SCHEMA!r})")
    version = data.get("schema_version")
    if isinstance(version, bool) or version not in SCHEMA_VERSIONS:
        shown = repr(version) if len(repr(version)) <= 40 else "(not a version number)"
        readable = ", ".join(map(str, SCHEMA_VERSIONS[:-1])) + f" and {SCHEMA_VERSIONS[-1]}"
        raise PackInvalid(f"{source}: pack schema_version={shown}; this moetune reads {readable}")
    try:
        model = PackModel.model_validate(data)
    except ValidationError as e:
        raise PackInvalid(f"{source}: {describe(e, data)}") from None
    entries = []
    for i, entry in enumerate(model.entries):
        try:  # the rules between fields (an even n for swiglu's two halves)
            problem = Problem(**entry.problem.model_dump(exclude={"schema_version"}))
        except ConfigInvalid as e:
            raise PackInvalid(f"{source}: entries[{i}].problem: {e}") from None
        if problem.schema_version > version:
            what = "a top_k" if problem.top_k else "scales"
            raise PackInvalid(
                f"{source}: entries[{i}].problem has {what} (problem schema_version "
                f"{problem.schema_version}), which a schema_version={version} pack cannot hold"
            )
        entries.append(PackEntry(problem, dict(entry.config), entry.median_s))
    device = DeviceFingerprint(**model.device.model_dump())
    return Pack(device, model.backend, model.kernel_source_hash, tuple(entries), model.created)


def load(path: str | Path) -> Pack:
    """Read and validate the pack file at `path` (a regular file of at most MAX_PACK_BYTES)."""
    data = read_input_file(path, limit=MAX_PACK_BYTES, what="pack", error=PackInvalid)
    return parse(decode(data, str(path)), str(path))


def decode(data: bytes, source: str) -> Any:
    """Strict JSON: UTF-8, no NaN or Infinity, no key twice in one object."""
    try:
        return json.loads(
            data.decode("utf-8"), parse_constant=_refuse_constant, object_pairs_hook=_unique_keys
        )
    except UnicodeDecodeError as e:
        raise PackInvalid(f"cannot read pack {source}: not UTF-8 text (byte {e.start})") from None
    except RecursionError:
        raise PackInvalid(f"cannot read pack {source}: JSON nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, a refused constant or key, an integer of too many digits
        raise PackInvalid(f"cannot read pack {source}: not valid JSON ({e})") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise ValueError(f"key {key!r} appears twice in one object")
        seen.add(key)
    return dict(pairs)
