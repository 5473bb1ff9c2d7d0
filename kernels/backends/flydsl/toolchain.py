"""Finding the FlyDSL compile toolchain: the worker interpreter and an ld.lld that links code object v6.

FlyDSL 0.5 imports torch and numpy in flydsl.compiler, and torch for Python 3.12 on PyPI is a CUDA build
of several GB; so the compiler runs in its own interpreter (scripts/setup-flydsl.sh makes one: Python 3.11,
flydsl, CPU torch) that compile.py starts as a subprocess. FlyDSL links the object it emits with
`$ROCM_PATH/llvm/bin/ld.lld`; on a machine without ROCm this module builds a private ROCM_PATH whose
llvm/bin/ld.lld is a symlink to the system's lld.

Which lld: FlyDSL emits code object v6 (ELF ABI version 4). Debian's `lld` 14 and `lld-16` reject it with
"unknown abi version" (both seen); `lld-19` (bookworm's lld-19 package) links it. Older majors are refused
with one clear error; MOETUNE_FLYDSL_LLD names any linker explicitly and skips the version check.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from moetune.kernels.errors import Unsupported

ENV_PYTHON = "MOETUNE_FLYDSL_PYTHON"
ENV_LLD = "MOETUNE_FLYDSL_LLD"
ENV_CACHE = "MOETUNE_FLYDSL_CACHE"
ENV_VENV = "MOETUNE_FLYDSL_VENV"
MIN_LLD_MAJOR = 19
SETUP_HINT = (
    "run scripts/setup-flydsl.sh (or set MOETUNE_FLYDSL_PYTHON to an interpreter with flydsl and torch)"
)


class ToolchainMissing(Unsupported):
    """The FlyDSL interpreter or a suitable ld.lld is not on this machine."""


@dataclasses.dataclass(frozen=True)
class Toolchain:
    python: str  # interpreter that imports flydsl (and torch)
    flydsl_version: str
    lld: str
    lld_version: str
    rocm_path: str  # a directory holding llvm/bin/ld.lld

    def env(self, arch: str) -> dict[str, str]:
        """Environment of one worker process compiling for `arch`."""
        env = dict(os.environ)
        env.update(
            ROCM_PATH=self.rocm_path,
            ARCH=arch,  # FlyDSL's compile-target override
            FLYDSL_GPU_ARCH=arch,  # what FlyDSL's helpers read instead of asking a device
            FLYDSL_RUNTIME_ENABLE_CACHE="0",
            PYTHONDONTWRITEBYTECODE="1",
        )
        return env


def _user_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "moetune"


def default_venv() -> Path:
    """Where scripts/setup-flydsl.sh puts the worker's virtual environment (same rule in the script)."""
    return Path(os.environ.get(ENV_VENV) or _user_cache() / "flydsl-venv")


def cache_dir() -> Path:
    """Where code objects (by hash) and the private ROCM_PATH live."""
    configured = os.environ.get(ENV_CACHE)
    path = Path(configured) if configured else _user_cache() / "flydsl"
    path.mkdir(parents=True, exist_ok=True)
    return path


def lld_major(version_text: str) -> int | None:
    """'Debian LLD 19.1.7 (compatible with GNU linkers)' -> 19."""
    match = re.search(r"LLD (\d+)\.", version_text)
    return int(match.group(1)) if match else None


def _version_of(lld: str) -> str:
    try:
        result = subprocess.run([lld, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unusable ({e})"
    return (
        (result.stdout or result.stderr).strip().splitlines()[0] if (result.stdout or result.stderr) else ""
    )


def _lld_candidates() -> list[str]:
    found: list[str] = []
    for root in filter(None, (os.environ.get("ROCM_PATH"), "/opt/rocm")):
        found.append(str(Path(root) / "llvm" / "bin" / "ld.lld"))
    on_path = {
        p for d in os.environ.get("PATH", "").split(os.pathsep) for p in glob.glob(os.path.join(d, "ld.lld*"))
    }
    versioned = sorted(
        glob.glob("/usr/lib/llvm-*/bin/ld.lld"), key=lambda p: -int(p.split("llvm-")[1].split("/")[0])
    )
    found += sorted(on_path, reverse=True) + versioned
    return [p for p in dict.fromkeys(found) if os.path.isfile(p) and os.access(p, os.X_OK)]


def find_lld() -> tuple[str, str]:
    """(path, version line) of a linker for code object v6; raises ToolchainMissing naming the fix."""
    explicit = os.environ.get(ENV_LLD)
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise ToolchainMissing(f"{ENV_LLD}={explicit} is not an executable file")
        return explicit, _version_of(explicit)
    seen = []
    for candidate in _lld_candidates():
        version = _version_of(candidate)
        major = lld_major(version)
        if major is not None and major >= MIN_LLD_MAJOR:
            return candidate, version
        seen.append(f"{candidate} ({version or 'no version'})")
    detail = f"; found only {', '.join(seen)}" if seen else ""
    raise ToolchainMissing(
        f"FlyDSL needs ld.lld >= {MIN_LLD_MAJOR} to link code object v6 "
        f"(Debian: apt-get install lld-19){detail}"
    )


def private_rocm_path(lld: str) -> str:
    """A ROCM_PATH for FlyDSL: the real one when `lld` is <root>/llvm/bin/ld.lld, else a symlink farm.

    Built under a temporary name and renamed into place, so parallel workers never see half of it.
    """
    resolved = Path(lld).resolve()
    if resolved.name == "ld.lld" and resolved.parent.name == "bin" and resolved.parent.parent.name == "llvm":
        return str(resolved.parent.parent.parent)
    key = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    target = cache_dir() / f"rocm-{key}"
    if (target / "llvm" / "bin" / "ld.lld").exists():
        return str(target)
    staging = Path(tempfile.mkdtemp(prefix=f".rocm-{key}-", dir=cache_dir()))
    (staging / "llvm" / "bin").mkdir(parents=True)
    (staging / "llvm" / "bin" / "ld.lld").symlink_to(resolved)
    try:
        staging.rename(target)
    except OSError:  # another process won the race: its directory is identical
        shutil.rmtree(staging, ignore_errors=True)
    return str(target)


def find_python() -> tuple[str, str]:
    """(interpreter, flydsl version) of the compile worker's interpreter."""
    explicit = os.environ.get(ENV_PYTHON)
    candidates = [explicit] if explicit else [str(default_venv() / "bin" / "python")]
    for python in candidates:
        if not python or not os.path.exists(python):
            continue
        probe = "import flydsl, torch, numpy; print(flydsl.__version__)"
        try:
            result = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ToolchainMissing(f"{python} cannot start ({e}); {SETUP_HINT}") from e
        if result.returncode == 0:
            return python, result.stdout.strip().splitlines()[-1]
        last = (result.stderr.strip().splitlines() or ["?"])[-1]
        raise ToolchainMissing(f"{python} cannot import flydsl, torch and numpy ({last}); {SETUP_HINT}")
    where = f"{ENV_PYTHON}={explicit}" if explicit else str(default_venv() / "bin" / "python")
    raise ToolchainMissing(f"no FlyDSL interpreter at {where}; {SETUP_HINT}")


@functools.cache
def toolchain() -> Toolchain:
    """The toolchain, found once per process; raises ToolchainMissing with the one fix to apply."""
    python, version = find_python()
    lld, lld_version = find_lld()
    return Toolchain(python, version, lld, lld_version, private_rocm_path(lld))
