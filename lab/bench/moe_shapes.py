"""Benchmark shapes, routings, inputs and the shipped pack's path, shared by bench_gemm.py,
device_kernel_check.py and gemm_table.py.

Mixtral-8x7B: 8 experts, top-2 routing, so T tokens give M = 2T rows and an expert sees at most T rows.
gate_up is [2T, 4096] x [8, 4096, 28672] (gate and up fused), down [2T, 14336] x [8, 14336, 4096].
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.resources
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

EXPERTS = 8
TOP_K = 2
PROJECTIONS = {"gate_up": (4096, 28672), "down": (14336, 4096)}  # (K, N)
TOKENS = (1, 16, 64, 128, 512, 1024, 4096, 16384)
ROUTINGS = ("balanced", "zipf")
# The shipped H200 pack, found where dispatch finds it (the installed moetune.configs package): the default
# of every script that reads its winners.
SHIPPED_PACK = Path(
    str(importlib.resources.files("moetune.configs") / "tuned" / "nvidia_h200__mosaic_gpu.json")
)


@dataclasses.dataclass(frozen=True)
class Shape:
    proj: str
    tokens: int

    @property
    def m(self) -> int:
        return TOP_K * self.tokens

    @property
    def k(self) -> int:
        return PROJECTIONS[self.proj][0]

    @property
    def n(self) -> int:
        return PROJECTIONS[self.proj][1]

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n

    @property
    def name(self) -> str:
        return f"{self.proj}_T{self.tokens}"


def group_sizes(shape: Shape, routing: str, g: int = EXPERTS) -> list[int]:
    """Rows per expert. 'balanced' splits M evenly; 'zipf' gives expert i a share proportional to
    1/(i+1), capped at T rows (top-2 sends a token to two different experts), by largest remainder."""
    m, cap = shape.m, shape.tokens
    if routing == "balanced":
        return [m // g + (i < m % g) for i in range(g)]
    if routing != "zipf":
        raise ValueError(f"routing={routing!r} is not one of {ROUTINGS}")
    weights = [1.0 / (i + 1) for i in range(g)]
    total = sum(weights)
    exact = [m * w / total for w in weights]
    sizes = [min(cap, int(x)) for x in exact]
    order = sorted(range(g), key=lambda i: exact[i] - int(exact[i]), reverse=True)
    while sum(sizes) < m:
        for i in order:
            if sum(sizes) < m and sizes[i] < cap:
                sizes[i] += 1
    return sizes


def make_weights(proj: str, seed: int = 0, transpose: bool = False):
    import jax
    import jax.numpy as jnp

    k, n = PROJECTIONS[proj]
    shape = (EXPERTS, n, k) if transpose else (EXPERTS, k, n)
    return (jax.random.normal(jax.random.key(seed), shape, jnp.float32) * 0.02).astype(jnp.bfloat16)


def make_lhs(shape: Shape, seed: int = 1):
    import jax
    import jax.numpy as jnp

    return jax.random.normal(jax.random.key(seed), (shape.m, shape.k), jnp.bfloat16)


def environment() -> dict:
    """Date, GPU, software versions and the command line, stored with every result file."""
    import jax
    import jaxlib

    info = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
    }
    device = jax.devices()[0]
    info["device_kind"] = device.device_kind
    info["compute_capability"] = str(getattr(device, "compute_capability", ""))
    info["sm_count"] = int(getattr(device, "core_count", 0))
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cuda"] = torch.version.cuda
    except ImportError:
        info["torch"] = None
    try:
        smi = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=20,
        )
        info["nvidia_smi"] = smi.stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        info["nvidia_smi"] = f"unavailable: {e}"
    return info


def target_ratios(case: dict) -> dict[str, float | None]:
    """The three ratios of a bench_gemm case (docs/performance.md): the better peer's time
    (torch._grouped_mm or ragged_dot_mgpu's best) over moetune's, cuBLAS's same-FLOP time over moetune's,
    and the HBM roofline of the touched weights over moetune's time (None where a time is missing)."""
    ms = {name: case["methods"].get(name, {}).get("median_ms") for name in case["methods"]}
    mine = ms.get("moetune")
    peers = [ms[name] for name in ("torch_grouped_mm", "mgpu_best") if ms.get(name)]
    cublas = ms.get("cublas_torch")
    return {
        "vs_peer": min(peers) / mine if mine and peers else None,
        "vs_cublas": cublas / mine if mine and cublas else None,
        "vs_roofline": case["hbm_roofline_ms"] / mine if mine else None,
    }


def write_json(path: str, payload: dict) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1, sort_keys=True, default=str)
