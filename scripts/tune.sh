#!/usr/bin/env bash
# The main job: a real tuning sweep on the embedded defaults, ending with the table of winners.
#   database: $MOETUNE_DB, else SQLite in the user data directory; cluster: a local Ray on 127.0.0.1;
#   device: whatever this machine has (on a CPU: the xla backend on the tiny model, a few minutes).
# Extra arguments go to `moetune tune`, e.g. scripts/tune.sh --sweep mixtral-8x7b  or  --dry-run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-venv.sh
.venv/bin/moetune doctor
.venv/bin/moetune db upgrade
sweep=(--sweep configs/sweeps/quickstart.yaml)
for arg in "$@"; do
  if [[ "$arg" == --sweep || "$arg" == --sweep=* || "$arg" == --resume || "$arg" == --resume=* ]]; then sweep=(); fi
done
exec .venv/bin/moetune tune "${sweep[@]}" "$@"
