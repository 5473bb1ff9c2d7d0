"""Whether a change to a backend's source changed any kernel a config pack names, on a CPU.

Any edit of a backend's source (its folder and the shared kernel modules it names: Backend.source_hash)
changes its source hash, and with it every stored winner goes stale. An edit that only adds a path (a new
argument, off by default) leaves every packed kernel as it was; this shows that without the pack's device:
each entry's kernel is built as its backend builds it (its op's Config class, the backend's own call
convention) on the pack's device, lowered for that device's platform (Mosaic GPU's and Pallas Triton's
lowering, short of PTX) and its module hashed with the source locations stripped (the outer module's and
each kernel's).

    python3 lab/bench/pack_lowering.py hashes before.json        # on the tree before the change
    python3 lab/bench/pack_lowering.py restamp before.json after.json
        # on the tree after it: hashes again, and only if every entry's module is unchanged, stamps the
        # pack with the current source hash (its configs, times and creation date stay as they are)
    python3 lab/bench/pack_lowering.py restamp before.json after.json --drop-changed
        # a change that does alter some kernels: their entries leave the pack (their times were of the
        # old kernels: a sweep on the device retunes them) and the rest are stamped
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import jax

from moetune.kernels import device as device_module
from moetune.kernels import packs, registry
from moetune.kernels.backend import Backend
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.lookup import LOOKUP

# Mosaic GPU names each kernel's dump after a per-process counter: two lowerings of one kernel differ in it.
DUMP_NAME = "mosaic_gpu.dump_basename"


@contextlib.contextmanager
def stripped_locations() -> Iterator[None]:
    """Mosaic GPU serializes each kernel's module with its source locations (file:line of every op in
    kernel_sm90.py) inside the custom call, and Pallas's Triton lowering does the same with its kernels',
    so an edit that only moves lines would change every hash. Strip them (and Mosaic GPU's dump name)
    before serialization (jax 0.11.2's private serde step and Triton lowering; pinned with jax)."""
    from jax._src.lib.mlir import passmanager
    from jax._src.pallas.triton import lowering as triton_lowering
    from jax.experimental.mosaic.gpu import core

    def strip(module) -> None:
        passmanager.PassManager.parse("builtin.module(strip-debuginfo)", module.context).run(module.operation)

    serde, lower_triton = core._run_serde_pass, triton_lowering.lower_jaxpr_to_triton_module

    def serde_stripped(module, *args, **kwargs):
        strip(module)
        if DUMP_NAME in module.operation.attributes:
            del module.operation.attributes[DUMP_NAME]
        return serde(module, *args, **kwargs)

    def triton_stripped(*args, **kwargs):
        result = lower_triton(*args, **kwargs)
        strip(result.module)
        return result

    with (
        mock.patch.object(core, "_run_serde_pass", serde_stripped),
        mock.patch.object(triton_lowering, "lower_jaxpr_to_triton_module", triton_stripped),
    ):
        yield


ROOT = Path(__file__).resolve().parents[2]
PACK = ROOT / "configs" / "tuned" / "nvidia_h200__mosaic_gpu.json"
LOCATION = re.compile(r"loc\([^()]*(\([^()]*\)[^()]*)*\)")  # loc("file":line:col) and nested callsites


@contextlib.contextmanager
def running_on(device: DeviceFingerprint) -> Iterator[None]:
    """Trace as on `device` from this CPU: every module's `current_fingerprint` answers it (a backend's build
    checks its facts, and a kernel that dispatches inside, as the unfused decode block's GEMMs do, looks its
    winners up for it), jax.default_backend() its platform (a Pallas kernel's "auto" mode), and Pallas's
    Triton lowering asks for its GPU, not the local one."""
    from jax._src.pallas.triton import gpu_info

    running = device_module.current_fingerprint
    holders = [m for m in list(sys.modules.values()) if getattr(m, "current_fingerprint", None) is running]
    version = gpu_info.gpu_version_from_device_kind(device.device_kind)
    with contextlib.ExitStack() as stack:
        for module in holders:
            stack.enter_context(mock.patch.object(module, "current_fingerprint", lambda: device))
        stack.enter_context(mock.patch.object(jax, "default_backend", lambda: device.platform))
        if version is not None:
            info = gpu_info.get_gpu_info_from_version(version)
            stack.enter_context(mock.patch.object(gpu_info, "get_gpu_info", lambda: info))
        yield


def lowering_platform(device: DeviceFingerprint) -> str:
    """jax's lowering platform of `device`: its runtime's name ("cuda 13000" -> "cuda"), else its platform."""
    return (device.runtime.split() or [device.platform])[0]


def module_text(backend: Backend, entry: packs.PackEntry, device: DeviceFingerprint) -> str:
    """`entry`'s kernel as `backend` builds it on `device` (its op's Config, its operands in the op spec's
    call order), lowered for the device's platform, without source locations."""
    problem = entry.problem
    config = backend.config_class(problem.op).from_dict(entry.config)
    with running_on(device):
        kernel = backend.build(problem, config)
        traced = jax.jit(kernel).trace(*problem.spec.shape_dtypes(problem))
        text = traced.lower(lowering_platforms=(lowering_platform(device),)).as_text()
    return "\n".join(line for line in LOCATION.sub("", text).splitlines() if not line.startswith("#loc"))


def module_hash(backend: Backend, entry: packs.PackEntry, device: DeviceFingerprint) -> str:
    return hashlib.sha256(module_text(backend, entry, device).encode()).hexdigest()[:16]


def hashes(pack: packs.Pack) -> dict:
    """The pack's backend's source hash and each entry's module hash. Kernels that dispatch inside look
    their winners up in the packs alone, so that a database cannot change what they lower to."""
    backend = registry.get(pack.backend)
    with LOOKUP.using_db(None):
        modules = {e.problem.key: module_hash(backend, e, pack.device) for e in pack.entries}
    return {"kernel_source_hash": backend.source_hash(), "modules": modules}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=("hashes", "restamp"))
    parser.add_argument("files", nargs="+", type=Path, help="hashes: OUT; restamp: BEFORE OUT")
    parser.add_argument("--pack", type=Path, default=PACK)
    parser.add_argument(
        "--drop-changed", action="store_true", help="restamp: remove the entries whose kernel changed"
    )
    args = parser.parse_args()
    pack = packs.load(args.pack)
    with stripped_locations():
        now = hashes(pack)
    args.files[-1].write_text(json.dumps(now, indent=1))
    print(f"{len(now['modules'])} kernels of {args.pack.name} on source {now['kernel_source_hash']}")
    if args.action == "hashes":
        return 0
    before = json.loads(args.files[0].read_text())
    changed = sorted(k for k in before["modules"] if before["modules"][k] != now["modules"].get(k))
    if before["modules"].keys() != now["modules"].keys() or (changed and not args.drop_changed):
        print(f"not restamped: {len(changed)} kernels changed, e.g. {changed[:3]}", file=sys.stderr)
        return 1
    data = json.loads(args.pack.read_text())
    if changed:
        kept = zip(data["entries"], pack.entries, strict=True)  # packs.load keeps the file's order
        data["entries"] = [raw for raw, entry in kept if entry.problem.key not in changed]
        print(f"dropped {len(changed)} entries whose kernel changed: {', '.join(changed)}")
    if data["kernel_source_hash"] != before["kernel_source_hash"]:
        print(
            f"not restamped: the pack is on source {data['kernel_source_hash']}, not 'before''s",
            file=sys.stderr,
        )
        return 1
    data["kernel_source_hash"] = now["kernel_source_hash"]
    args.pack.write_text(json.dumps(data, indent=1) + "\n")
    print(f"restamped {args.pack.name}: {before['kernel_source_hash']} -> {now['kernel_source_hash']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
