#!/usr/bin/env bash
# The test suite (CPU). Sets up .venv first. Extra arguments go to pytest.
# PostgreSQL tests run when MOETUNE_TEST_POSTGRES_URL is set (.ci/run starts a server and sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-venv.sh
exec .venv/bin/python -m pytest "$@"
