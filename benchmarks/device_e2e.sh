#!/usr/bin/env bash
# End to end on one GPU machine, in one call (the device lease is short): a real Ray sweep through
# `moetune tune`, the config pack export, the HTML report, a --resume re-run that must repeat nothing,
# the tuner throughput benchmark, and the GPU tests. Every step is time-boxed and logged under $OUT.
#
# On the H200 (from the repository root, with .devdeps carried; see benchmarks/README.md):
#   bash benchmarks/device_e2e.sh
# A CPU dry run of the same plumbing:
#   OUT=/tmp/e2e E2E_MODEL=tiny E2E_BUCKETS=1,64 E2E_BACKEND=xla E2E_SKIP_GPU_TESTS=1 bash benchmarks/device_e2e.sh
set -uo pipefail
OUT=${OUT:?set OUT to a folder for logs and artifacts}
MODEL=${E2E_MODEL:-mixtral-8x7b}
BUCKETS=${E2E_BUCKETS:-}
BACKEND=${E2E_BACKEND:-mosaic_gpu}
BUDGET=${E2E_BUDGET:-12}
WORKERS=${E2E_WORKERS:-8}
SWEEP_S=${E2E_SWEEP_S:-300}
GPU_KIND=${E2E_GPU:-NVIDIA H200}
mkdir -p "$OUT"

if ! python3 -c 'import ray, optuna, sqlalchemy' 2>/dev/null; then  # the GPU image: unpack the bundle
  mkdir -p /tmp/site && tar xJf .devdeps/site.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
fi
MOETUNE=(python3 -m moetune.tuner.cli)
export PYTHONUNBUFFERED=1
export MOETUNE_DB="sqlite:///$OUT/sweep.db"
# Many worker processes share one GPU: no preallocation, and memory goes back to the driver when freed,
# so that the largest shapes' verification buffers of one worker never starve another. Kernel times are
# CUPTI times of the kernel alone, which the allocator does not touch.
export XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_ALLOCATOR=platform

# The whole script ends by DEADLINE_S (a device call is capped at 600 s): each step gets at most its own
# cap and never more than what is left.
DEADLINE=$(( $(date +%s) + ${E2E_DEADLINE_S:-570} ))
cap() { local left=$(( DEADLINE - $(date +%s) )); [ "$left" -lt "$1" ] && echo $(( left > 5 ? left : 5 )) || echo "$1"; }
step() { printf '\n=== [%s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
bucket_args=(); [ -n "$BUCKETS" ] && bucket_args=(--buckets "$BUCKETS")

step "sweep: $MODEL on $BACKEND, tpe budget $BUDGET, balanced + zipf routing"
start=$(date +%s)
timeout "$(cap $((SWEEP_S + 45)))" "${MOETUNE[@]}" tune --model "$MODEL" "${bucket_args[@]}" --backend "$BACKEND" \
  --strategy tpe --budget "$BUDGET" --routing zipf:1.2 --workers "$WORKERS" --timeout-s 120 \
  --minutes "$(python3 -c "print($SWEEP_S / 60)")" --json >"$OUT/sweep.json" 2>"$OUT/sweep.log"
echo "sweep rc=$? in $(( $(date +%s) - start )) s"; tail -5 "$OUT/sweep.log"

step "export the pack, write the report"
"${MOETUNE[@]}" export --gpu "$GPU_KIND" --backend "$BACKEND" -o "$OUT/pack.json" 2>&1 | tail -3
"${MOETUNE[@]}" report 1 --out "$OUT/report.html" 2>&1 | tail -2
"${MOETUNE[@]}" trials --sweep 1 --json >"$OUT/trials.json" 2>/dev/null; echo "trials rows: $(grep -c '"id"' "$OUT/trials.json")"

if [ -z "${E2E_SKIP_RESUME:-}" ]; then
step "resume: sweep 1 again must repeat no finished trial"
timeout "$(cap 90)" "${MOETUNE[@]}" tune --resume 1 --json >"$OUT/resume.json" 2>"$OUT/resume.log"
echo "resume rc=$?"; tail -3 "$OUT/resume.log"
fi

if [ -z "${E2E_SKIP_BENCH:-}" ]; then
step "tuner throughput: Ray vs one by one"
timeout "$(cap 120)" "${MOETUNE[@]}" bench tuner --model "$MODEL" --buckets "${E2E_BENCH_BUCKETS:-256}" --backend "$BACKEND" \
  --budget 16 --workers "$WORKERS" --out "$OUT/throughput.json" >"$OUT/throughput.log" 2>&1
echo "bench rc=$?"; tail -6 "$OUT/throughput.log"
fi

if [ -z "${E2E_SKIP_GPU_TESTS:-}" ]; then
  step "GPU tests"
  unset XLA_PYTHON_CLIENT_ALLOCATOR
  timeout "$(cap 240)" python3 -m pytest ${E2E_GPU_TESTS:-tests/gpu/test_mosaic_gpu_kernel.py} -m gpu -q -p no:cacheprovider >"$OUT/gpu-tests.log" 2>&1
  echo "gpu tests rc=$?"; tail -4 "$OUT/gpu-tests.log"
fi
step "pack up: merge the database's WAL, bundle the logs (a device call returns at most 8 files)"
python3 -c "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()" "$OUT/sweep.db"
rm -f "$OUT/sweep.db-wal" "$OUT/sweep.db-shm"
(cd "$OUT" && find . -maxdepth 1 -type f \( -name '*.log' -o -name '*.json' \) ! -name e2e.log ! -name pack.json -print0 \
  | tar --null -T - -czf logs.tgz --remove-files)
ls -la "$OUT"
step "done"
