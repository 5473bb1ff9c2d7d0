#!/usr/bin/env bash
# Installs the FlyDSL compile toolchain for the `flydsl` backend on a CPU-only Linux machine (CI included):
#   1. ld.lld >= 19 (Debian's lld-19; the default `lld` 14 cannot link FlyDSL's code object v6),
#   2. a Python 3.11 virtual environment with flydsl and a CPU build of torch (flydsl.compiler imports
#      torch and numpy; PyPI's torch for Python 3.12 is a multi-GB CUDA build, the CPU 2.13.0 wheel for 3.11
#      lies on this kind of machine's disk).
# moetune (Python 3.12) runs the compiler in that environment as a subprocess (kernels/backends/flydsl/toolchain.py
# finds it at the same default path). Re-running is cheap: it reinstalls only when the pinned versions change.
#
# Environment: MOETUNE_FLYDSL_VENV (default ${XDG_CACHE_HOME:-$HOME/.cache}/moetune/flydsl-venv),
# MOETUNE_FLYDSL_PYTHON_BASE (the Python 3.11 to build the venv from; default: python3.11 on PATH).
set -euo pipefail

FLYDSL_VERSION=0.5.0
TORCH_VERSION=2.13.0
VENV=${MOETUNE_FLYDSL_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/moetune/flydsl-venv}
started=$(date +%s)

have_lld() {
  local candidate
  for candidate in "${MOETUNE_FLYDSL_LLD:-}" "$(command -v ld.lld-19 || true)" /usr/lib/llvm-19/bin/ld.lld; do
    [ -n "$candidate" ] && [ -x "$candidate" ] && return 0
  done
  return 1
}

if ! have_lld; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "setup-flydsl: need ld.lld >= 19: install Debian's lld-19 (apt-get install lld-19) or set MOETUNE_FLYDSL_LLD" >&2
    exit 1
  fi
  echo "setup-flydsl: installing lld-19" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq lld-19 >/dev/null
fi

base=${MOETUNE_FLYDSL_PYTHON_BASE:-}
if [ -z "$base" ]; then
  for candidate in python3.11; do
    if PYENV_VERSION=3.11.7 command -v "$candidate" >/dev/null 2>&1 \
      && PYENV_VERSION=3.11.7 "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
      base=$candidate
    fi
  done
fi
if [ -z "$base" ]; then
  echo "setup-flydsl: need Python 3.11 for the CPU torch wheel (pyenv install 3.11, or set MOETUNE_FLYDSL_PYTHON_BASE)" >&2
  exit 1
fi

stamp="$VENV/.moetune-flydsl-stamp"
want="flydsl==$FLYDSL_VERSION torch==$TORCH_VERSION"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup-flydsl: creating $VENV ($want)" >&2
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  PYENV_VERSION=3.11.7 "$base" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "flydsl==$FLYDSL_VERSION" "torch==$TORCH_VERSION" numpy
  echo "$want" > "$stamp"
fi

"$VENV/bin/python" -c 'import flydsl.compiler, flydsl.expr, torch; print("setup-flydsl: flydsl", __import__("flydsl").__version__, "torch", torch.__version__)' >&2
echo "setup-flydsl: ready in $(( $(date +%s) - started )) s (interpreter $VENV/bin/python)" >&2
