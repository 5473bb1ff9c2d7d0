#!/usr/bin/env bash
# Creates (or refreshes) .venv with Python 3.12 and moetune installed editable with its dev, postgres and maxtext
# extras. Re-running is cheap: it reinstalls only when pyproject.toml or setup.py changed.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  local candidates=(python3.12 python3)
  for py in "${candidates[@]}"; do
    if PYENV_VERSION=3.12.1 command -v "$py" >/dev/null 2>&1 \
      && PYENV_VERSION=3.12.1 "$py" -c 'import sys; sys.exit(sys.version_info[:2] < (3, 12))' 2>/dev/null; then
      echo "$py"; return 0
    fi
  done
  echo "moetune needs Python >= 3.12 (python3.12 not found; with pyenv: pyenv install 3.12)" >&2
  return 1
}

if [ ! -x .venv/bin/python ]; then
  py=$(find_python)
  echo "creating .venv with $(PYENV_VERSION=3.12.1 "$py" --version)" >&2
  PYENV_VERSION=3.12.1 "$py" -m venv .venv
fi

stamp=.venv/.moetune-install-stamp
want=$(cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "installing moetune and its dependencies into .venv (first run takes a few minutes)" >&2
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[dev,postgres,maxtext]'
  echo "$want" > "$stamp"
fi
