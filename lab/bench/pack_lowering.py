"""Whether a change to the mosaic_gpu backend's source changed any kernel a config pack names, on a CPU.

Any edit of kernels/backends/mosaic_gpu/ changes the backend's source hash, and with it every stored
winner goes stale. An edit that only adds a path (a new argument, off by default) leaves every packed
kernel as it was; this shows that without a GPU: each entry's kernel is exported for cuda (Mosaic GPU's
lowering, short of PTX) and its module hashed with the source locations stripped (the outer module's
and the kernel's).

    python3 lab/bench/pack_lowering.py hashes before.json        # on the tree before the change
    python3 lab/bench/pack_lowering.py restamp before.json after.json
        # on the tree after it: hashes again, and only if every entry's module is unchanged, stamps the
        # pack with the current source hash (its configs, times and creation date stay as they are)
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

from moetune.kernels import packs, registry
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig


def _strip_kernel_locations() -> None:
    """Mosaic GPU serializes each kernel's module with its source locations (file:line of every op in
    kernel_sm90.py) inside the custom call, so an edit that only moves lines would change every hash.
    Strip them before serialization (jax 0.11.2's private serde step; pinned with jax)."""
    from jax._src.lib.mlir import passmanager
    from jax.experimental.mosaic.gpu import core

    serde = core._run_serde_pass

    def stripped(module, *args, **kwargs):
        passmanager.PassManager.parse("builtin.module(strip-debuginfo)", module.context).run(module.operation)
        return serde(module, *args, **kwargs)

    core._run_serde_pass = stripped


ROOT = Path(__file__).resolve().parents[1]
PACK = ROOT / "configs" / "tuned" / "nvidia_h200__mosaic_gpu.json"
LOCATION = re.compile(r"loc\([^()]*(\([^()]*\)[^()]*)*\)")  # loc("file":line:col) and nested callsites


def module_hash(entry: packs.PackEntry, num_sms: int) -> str:
    """The hash of `entry`'s kernel lowered for cuda, called as the backend builds it (its op's kernel
    from the backend's table, the op spec's operand shapes in call order, scales' layout if it has one)."""
    p = entry.problem
    scaled = {} if p.scale_layout == "none" else {"scale_layout": p.scale_layout}
    kernel = functools.partial(
        registry.get("mosaic_gpu").kernel_for(p.op),
        config=MosaicGpuConfig(**entry.config),
        num_sms=num_sms,
        transpose_rhs=p.transpose_rhs,
        out_dtype=jnp.dtype(p.out_dtype),
        **scaled,
    )
    text = jax.export.export(jax.jit(kernel), platforms=["cuda"])(*p.spec.shape_dtypes(p)).mlir_module()
    text = "\n".join(line for line in LOCATION.sub("", text).splitlines() if not line.startswith("#loc"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def hashes(pack: packs.Pack) -> dict:
    return {
        "kernel_source_hash": registry.get("mosaic_gpu").source_hash(),
        "modules": {e.problem.key: module_hash(e, pack.device.core_count) for e in pack.entries},
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=("hashes", "restamp"))
    parser.add_argument("files", nargs="+", type=Path, help="hashes: OUT; restamp: BEFORE OUT")
    parser.add_argument("--pack", type=Path, default=PACK)
    args = parser.parse_args()
    _strip_kernel_locations()
    pack = packs.load(args.pack)
    now = hashes(pack)
    args.files[-1].write_text(json.dumps(now, indent=1))
    print(f"{len(now['modules'])} kernels of {args.pack.name} on source {now['kernel_source_hash']}")
    if args.action == "hashes":
        return 0
    before = json.loads(args.files[0].read_text())
    changed = sorted(k for k in before["modules"] if before["modules"][k] != now["modules"].get(k))
    if changed or before["modules"].keys() != now["modules"].keys():
        print(f"not restamped: {len(changed)} kernels changed, e.g. {changed[:3]}", file=sys.stderr)
        return 1
    data = json.loads(args.pack.read_text())
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
