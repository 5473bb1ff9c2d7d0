"""Values for the database tests: fingerprints, a problem, a trial-record factory; with plain SQLAlchemy
rather than the store, the tables a database holds and a sweep's heartbeat moved back; and a file made
immutable, as a database that stops accepting writes."""

from __future__ import annotations

import dataclasses
import datetime
import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa

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
# The same GPU model under another driver: another fingerprint, same device_kind.
H200_NEW_DRIVER = dataclasses.replace(H200, driver="590.10")
MI300 = dataclasses.replace(
    H200, device_kind="AMD Instinct MI300X", platform="rocm", core_count=304, compute_capability="gfx942"
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


def table_names(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return set(sa.inspect(connection).get_table_names())
    finally:
        engine.dispose()


SWEEPS = sa.table("sweeps", sa.column("id"), sa.column("heartbeat_at", sa.DateTime()))


def age_heartbeat(url: str, sweep_id: int, seconds: float) -> None:
    """Move the sweep's last heartbeat `seconds` into the past, as if its owner had gone silent."""
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        where = SWEEPS.c.id == sweep_id
        beat = connection.scalar(sa.select(SWEEPS.c.heartbeat_at).where(where))
        older = beat - datetime.timedelta(seconds=seconds)
        connection.execute(sa.update(SWEEPS).where(where).values(heartbeat_at=older))
    engine.dispose()


def set_immutable(path: Path, on: bool) -> None:
    """chattr +i (or -i): a file that nobody may write, root included (chmod does not stop root). Skips
    the test where the file system or the user's capabilities do not allow it."""
    try:
        done = subprocess.run(["chattr", "+i" if on else "-i", str(path)], capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("chattr is not installed")
    if done.returncode and on:
        pytest.skip(f"cannot make {path.name} immutable here: {done.stderr.strip()}")
