#!/usr/bin/env bash
# The lab's tests, in moetune's virtualenv: installs the lab beside moetune (editable, no dependencies
# beyond what moetune's dev extras bring), then runs pytest in lab/. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-venv.sh
source scripts/test-env.sh
.venv/bin/python -m pip install -q --no-deps --no-build-isolation -e lab
cd lab
exec ../.venv/bin/python -m pytest "$@"
