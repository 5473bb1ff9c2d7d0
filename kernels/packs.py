"""Config packs: versioned JSON files of winners for one device model and backend, shipped in configs/tuned/.

A pack is plain data (never pickle), validated on load. Layout (schema_version 1):

    {"schema": "moetune.pack", "schema_version": 1, "created": "2026-11-29T12:00:00Z",
     "device": {<DeviceFingerprint fields>}, "backend": "mosaic_gpu", "kernel_source_hash": "ab12...",
     "entries": [{"problem": {<Problem fields>}, "config": {<Config fields>}, "median_s": 0.00123}]}
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
from pathlib import Path
from typing import Any

from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import ConfigInvalid, PackInvalid
from moetune.kernels.problem import Problem

SCHEMA = "moetune.pack"
SCHEMA_VERSION = 1


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
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
    if version != SCHEMA_VERSION:
        raise PackInvalid(f"{source}: pack schema_version={version!r}; this moetune reads {SCHEMA_VERSION}")
    for key, kind in (("device", dict), ("backend", str), ("kernel_source_hash", str), ("entries", list)):
        if not isinstance(data.get(key), kind):
            raise PackInvalid(f"{source}: field {key!r} is missing or not a {kind.__name__}")
    try:
        device = DeviceFingerprint(**data["device"])
    except TypeError as e:
        raise PackInvalid(f"{source}: bad device fingerprint ({e})") from e
    entries = []
    for i, raw in enumerate(data["entries"]):
        if not isinstance(raw, dict) or not isinstance(raw.get("config"), dict):
            raise PackInvalid(f"{source}: entry {i} has no config mapping")
        median = raw.get("median_s")
        if median is not None and not (isinstance(median, (int, float)) and median > 0):
            raise PackInvalid(f"{source}: entry {i} median_s={median!r} is not a positive number")
        try:
            problem = Problem.from_dict(raw.get("problem") or {})
        except (ConfigInvalid, TypeError) as e:
            raise PackInvalid(f"{source}: entry {i} has a bad problem ({e})") from e
        entries.append(PackEntry(problem, raw["config"], median))
    return Pack(
        device, data["backend"], data["kernel_source_hash"], tuple(entries), str(data.get("created", ""))
    )


def load(path: str | Path) -> Pack:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PackInvalid(f"{path}: cannot read pack ({e})") from e
    return parse(data, str(path))
