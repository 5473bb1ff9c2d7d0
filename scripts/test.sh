#!/usr/bin/env bash
# The test suite (CPU). Sets up .venv first. Extra arguments go to pytest and win over these defaults.
#
#   scripts/test.sh              the fast tier: every test not marked slow (pyproject's addopts)
#   scripts/test.sh -m slow      the second tier: Ray clusters, end-to-end subprocess runs, MaxText meshes,
#                                browsers, PostgreSQL faults
#   scripts/test.sh -m ""        both tiers
#   scripts/test.sh -n 0 FILE    one process (no pytest-xdist workers), e.g. for one file or a debugger
#
# Two pytest-xdist workers by default, each test file on one of them (loadfile: a module's fixtures, a Ray
# cluster or a server, start once): the fast tier then takes about half its serial time on two cores.
# PostgreSQL tests run when MOETUNE_TEST_POSTGRES_URL is set (.ci/run starts a server and sets it).
# Every process the run starts shares jax's persistent compilation cache (scripts/test-env.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-venv.sh
source scripts/test-env.sh
exec .venv/bin/python -m pytest -n 2 --dist loadfile "$@"
