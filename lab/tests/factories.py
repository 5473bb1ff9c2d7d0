"""Values for the lab's tests of sweep-database tools: an H200 fingerprint, a problem, a trial record."""

from __future__ import annotations

from moetune.db.records import TrialRecord
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.problem import Problem

H200 = DeviceFingerprint(
    device_kind="NVIDIA H200",
    platform="gpu",
    core_count=132,
    memory_bytes=150_000_000_000,
    compute_capability="9.0",
    driver="580.65",
    runtime="13.0",
    jax_version="0.11.2",
    jaxlib_version="0.11.2",
)
GATE_UP = Problem("grouped_matmul", m=4096, k=4096, n=28672, g=8)


def trial(
    *,
    config: dict | None = None,
    status: str = "ok",
    median_s: float | None = 1e-3,
    device: DeviceFingerprint = H200,
    backend: str = "fake",
    source_hash: str = "src1",
    problem: Problem = GATE_UP,
    sweep_id: int | None = None,
    **extra,
) -> TrialRecord:
    """A trial record with plausible defaults; tests override what they check."""
    return TrialRecord(
        sweep_id=sweep_id,
        device=device,
        backend=backend,
        family="sm90",
        source_hash=source_hash,
        problem=problem,
        config={"block_m": 64, "block_n": 128} if config is None else config,
        status=status,
        samples_s=(median_s, median_s) if median_s is not None else (),
        median_s=median_s,
        **extra,
    )
