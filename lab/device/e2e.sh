#!/usr/bin/env bash
# End to end on a GPU machine, in one run of at most 10 minutes:
#   GPU 0: the Mixtral sweep through `moetune tune` on a local Ray cluster (every token bucket, both GEMMs,
#          each candidate timed on balanced and Zipf routing), the pack export, the HTML report, a --resume
#          and a --stale re-run that must repeat nothing, then the shipped-pack dispatch test on the new pack;
#   GPU 1 (on a host with two): at the same time, the exhaustive grid of a narrowed space on four problems (two
#          decode, two prefill), compared with the sweep's winners (lab/bench/compare_grid.py), GPU tests
#          (E2E_GPU1_TESTS), `moetune bench tuner`, and with E2E_MODEL_LAYERS=N, once the sweep has ended,
#          lab/model/cli.py on an N-layer Mixtral reading the sweep's winners from its database.
#          E2E_SKIP_GPU1=1 leaves GPU 1 (and its cores) to another job of the same run; E2E_SKIP_BENCH=1
#          skips the throughput bench there.
# E2E_IMPORT_PACK=FILE imports a pack into the sweep's database first: its winners are then the sweep's
# warm starts (after a kernel change they are of another source hash, so they are tried, not kept).
# E2E_STALE_BUDGET=N then re-tunes every winner left stale (`tune --stale`, budget N, E2E_STALE_S seconds):
# with E2E_IMPORT_PACK and E2E_BUCKETS, a kernel change re-tunes some buckets fully and the rest cheaply.
# E2E_RESUME_DB=FILE resumes sweep E2E_RESUME_SWEEP (default 1) of a copy of that database instead.
# E2E_EXTRA_SWEEP=FILE runs that sweep file too, after the model's sweep and into the same database (budget
# E2E_EXTRA_BUDGET, E2E_EXTRA_S seconds), so the exported pack holds its winners as well.
# Every step is time-boxed (E2E_DEADLINE_S); logs and artifacts land under $OUT, the logs in one tarball.
# The defaults (TPE, budget 16 per problem, 14 workers, balanced and Zipf routing) sweep Mixtral-8x7B's 30
# problems on one H200 well within the deadline.
#
# On the GPU machine, from the repository root with .devdeps carried:
#   bash lab/device/e2e.sh
# A CPU rehearsal of the same plumbing:
#   OUT=$(mktemp -d) E2E_MODEL=tiny E2E_BUCKETS=1,64 E2E_BACKEND=xla E2E_SKIP_GPU_TESTS=1 E2E_SKIP_GRID=1 bash lab/device/e2e.sh
set -uo pipefail
OUT=${OUT:?set OUT to a folder for logs and artifacts}
mkdir -p "$OUT"
source lab/device/env.sh
MODEL=${E2E_MODEL:-mixtral-8x7b}
BUCKETS=${E2E_BUCKETS:-}
BACKEND=${E2E_BACKEND:-mosaic_gpu}
BUDGET=${E2E_BUDGET:-16}
WORKERS=${E2E_WORKERS:-14}
SWEEP_S=${E2E_SWEEP_S:-290}
ROUTING=${E2E_ROUTING:-balanced,zipf:1.2}
GPU_KIND=${E2E_GPU:-NVIDIA H200}
export MOETUNE_DB="sqlite:///$OUT/sweep.db"
SWEEP=1  # the sweep's id in its database; an imported pack takes id 1
DEADLINE=$(( $(date +%s) + ${E2E_DEADLINE_S:-560} ))
# One `moetune tune ARGS` on GPU 0 with a --minutes of SECONDS, killed GRACE seconds after that: the outcome to
# NAME.json, the log to NAME.log, then "LABEL rc=... in ... s" and the log's last lines.
timed_tune() {  # NAME LABEL SECONDS GRACE ARGS...
  local name=$1 label=$2 seconds=$3 grace=$4 start rc
  shift 4
  start=$(date +%s)
  timeout "$(cap $((seconds + grace)))" "${on_gpu0[@]}" "${MOETUNE[@]}" tune "$@" --workers "$WORKERS" \
    --minutes "$(python3 -c "print($seconds / 60)")" --json >"$OUT/$name.json" 2>"$OUT/$name.log"
  rc=$?
  echo "$label rc=$rc in $(( $(date +%s) - start )) s"; grep -v "logging.cc\|^    @" "$OUT/$name.log" | tail -4
}
gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c GPU)
cores=$(nproc)
share=$(( gpus >= 2 ? cores / 2 : cores ))
bucket_args=(); [ -n "$BUCKETS" ] && bucket_args=(--buckets "$BUCKETS")
on_gpu0=(env); [ "$gpus" -ge 2 ] && on_gpu0=(env CUDA_VISIBLE_DEVICES=0 taskset -c "0-$((share - 1))")

if [ "$gpus" -ge 2 ] && [ -z "${E2E_SKIP_GPU1:-}" ]; then
  step "GPU 1: ${E2E_SKIP_GRID:+no }exhaustive grid (lab/device/grid_check.yaml), GPU tests: ${E2E_GPU1_TESTS:-none}, then the tuner's throughput"
  on_gpu1=(env CUDA_VISIBLE_DEVICES=1 taskset -c "$share-$((cores - 1))")
  (if [ -z "${E2E_SKIP_GRID:-}" ]; then
     MOETUNE_DB="sqlite:///$OUT/grid.db" timeout "$(cap ${E2E_GRID_S:-270})" "${on_gpu1[@]}" \
       "${MOETUNE[@]}" tune --sweep lab/device/grid_check.yaml --routing "$ROUTING" --workers "$WORKERS" --no-baseline \
       --minutes "$(python3 -c "print(${E2E_GRID_S:-270} / 60 - 0.75)")" --json >"$OUT/grid.json" 2>"$OUT/grid.log"
     echo "grid rc=$?" >>"$OUT/grid.log"
   fi
   if [ -n "${E2E_GPU1_TESTS:-}" ]; then
     (unset XLA_PYTHON_CLIENT_ALLOCATOR; timeout "$(cap ${E2E_GPU1_TESTS_S:-200})" "${on_gpu1[@]}" \
       python3 -m pytest $E2E_GPU1_TESTS -m gpu -q -p no:cacheprovider -rs >"$OUT/gpu-tests.log" 2>&1)
     echo "gpu tests rc=$?" >>"$OUT/gpu-tests.log"
   fi
   # The tuner's throughput on this GPU: Ray against one by one, same candidates, in one run.
   if [ -z "${E2E_SKIP_BENCH:-}" ]; then
     timeout "$(cap ${E2E_BENCH_S:-150})" "${on_gpu1[@]}" "${MOETUNE[@]}" bench tuner --model "$MODEL" --buckets "${E2E_BENCH_BUCKETS:-64,256}" \
       --backend "$BACKEND" --budget "${E2E_BENCH_BUDGET:-16}" --sequential-budget "${E2E_SEQ_BUDGET:-4}" --routing "$ROUTING" \
       --workers "$WORKERS" --timeout-s 120 --out "$OUT/throughput.json" >"$OUT/throughput.log" 2>&1
     echo "bench rc=$?" >>"$OUT/throughput.log"
   fi
   if [ -n "${E2E_MODEL_LAYERS:-}" ]; then
     # The MoE layer on the sweep's winners (read from its database once GPU 0's sweep has ended) against
     # the dense and XLA ragged_dot layers: lab/model/cli.py on a model E2E_MODEL_LAYERS deep.
     while [ ! -e "$OUT/sweep.done" ] && [ "$(date +%s)" -lt "$DEADLINE" ]; do sleep 5; done
     (unset XLA_PYTHON_CLIENT_ALLOCATOR; timeout "$(cap ${E2E_MODEL_S:-150})" "${on_gpu1[@]}" python3 -m moetune_lab.model \
       --model mixtral_8x7b --layers "$E2E_MODEL_LAYERS" --batch 1 --prompt 2048 --gen 16 --out "$OUT/model_layers.json" \
       >"$OUT/model_layers.log" 2>&1)
     echo "model bench rc=$?" >>"$OUT/model_layers.log"
   fi) &
  gpu1=$!
fi

if [ -n "${E2E_RESUME_DB:-}" ]; then
  SWEEP=${E2E_RESUME_SWEEP:-1}  # 2 when the database's first sweep was a pack import
  step "GPU 0: resume sweep $SWEEP of $E2E_RESUME_DB (cut short by its minutes before), $WORKERS workers"
  cp "$E2E_RESUME_DB" "$OUT/sweep.db" && chmod u+w "$OUT/sweep.db"
  "${MOETUNE[@]}" trials --sweep "$SWEEP" --limit 0 --json >"$OUT/trials-before-resume.json" 2>/dev/null
  timed_tune sweep "resumed sweep" "$SWEEP_S" "${E2E_SWEEP_GRACE_S:-60}" --resume "$SWEEP"
else
  if [ -n "${E2E_IMPORT_PACK:-}" ]; then
    step "import $E2E_IMPORT_PACK: its winners become the sweep's warm starts"
    "${MOETUNE[@]}" import "$E2E_IMPORT_PACK" 2>&1 | tail -2 && SWEEP=2
  fi
  step "GPU 0: sweep $MODEL on $BACKEND, tpe budget $BUDGET per problem, routing $ROUTING, $WORKERS workers"
  timed_tune sweep sweep "$SWEEP_S" "${E2E_SWEEP_GRACE_S:-60}" --model "$MODEL" "${bucket_args[@]}" --backend "$BACKEND" \
    --strategy tpe --budget "$BUDGET" --routing "$ROUTING" --timeout-s 120
fi
if [ -n "${E2E_EXTRA_SWEEP:-}" ]; then
  step "GPU 0: the extra sweep $E2E_EXTRA_SWEEP, budget ${E2E_EXTRA_BUDGET:-12} per problem, into the same database"
  timed_tune extra_sweep "extra sweep" "${E2E_EXTRA_S:-120}" 45 --sweep "$E2E_EXTRA_SWEEP" --backend "$BACKEND" \
    --budget "${E2E_EXTRA_BUDGET:-12}" --routing "$ROUTING" --timeout-s 120
fi

if [ -n "${E2E_STALE_BUDGET:-}" ]; then
  # After a kernel change, a sweep of a few buckets (E2E_BUCKETS) leaves the imported winners of the others
  # stale, and the export would drop them: re-tune those with a small budget (their old winner is a warm start).
  step "GPU 0: the stale winners, budget $E2E_STALE_BUDGET per problem, into the same database"
  timed_tune stale_sweep "stale sweep" "${E2E_STALE_S:-120}" 45 --stale --backend "$BACKEND" --strategy tpe \
    --budget "$E2E_STALE_BUDGET" --routing "$ROUTING" --timeout-s 120 --no-baseline
fi

touch "$OUT/sweep.done"
step "export the pack, write the report"
"${MOETUNE[@]}" export --gpu "$GPU_KIND" --backend "$BACKEND" -o "$OUT/pack.json" 2>&1 | tail -3
"${MOETUNE[@]}" report "$SWEEP" --out "$OUT/report.html" 2>&1 | tail -2
"${MOETUNE[@]}" trials --sweep "$SWEEP" --limit 0 --json >"$OUT/trials.json" 2>/dev/null; echo "trials rows: $(grep -c '"id"' "$OUT/trials.json")"

if [ -z "${E2E_SKIP_GPU_TESTS:-}" ] && [ -s "$OUT/pack.json" ]; then
  step "dispatch from the new pack, shipped as configs/tuned/nvidia_h200__mosaic_gpu.json in this copy"
  cp "$OUT/pack.json" configs/tuned/nvidia_h200__mosaic_gpu.json
  (unset XLA_PYTHON_CLIENT_ALLOCATOR MOETUNE_DB; MOETUNE_DB="sqlite:///$OUT/empty.db" timeout "$(cap 100)" "${on_gpu0[@]}" \
    env MOETUNE_PACK_M="${E2E_DISPATCH_M:-2,32,8192}" python3 -m pytest tests/gpu/test_shipped_pack_dispatch.py -m gpu -q -p no:cacheprovider -rs \
    >"$OUT/dispatch-tests.log" 2>&1)
  echo "dispatch tests rc=$?"; tail -4 "$OUT/dispatch-tests.log"
  MOETUNE_DB="sqlite:///$OUT/empty.db" "${MOETUNE[@]}" best --gpu "$GPU_KIND" >"$OUT/best-shipped.log" 2>&1; tail -8 "$OUT/best-shipped.log"
fi

if [ -z "${E2E_SKIP_RESUME:-}" ]; then
  step "resume: sweep $SWEEP again must repeat no finished trial"
  timeout "$(cap 90)" "${on_gpu0[@]}" "${MOETUNE[@]}" tune --resume "$SWEEP" --workers 2 --json >"$OUT/resume.json" 2>"$OUT/resume.log"
  echo "resume rc=$?"; tail -3 "$OUT/resume.log"
  step "stale: nothing changed, so nothing is stale"
  timeout "$(cap 60)" "${on_gpu0[@]}" "${MOETUNE[@]}" tune --stale --backend "$BACKEND" --workers 1 --json >"$OUT/stale.json" 2>"$OUT/stale.log"
  echo "stale rc=$?"; tail -3 "$OUT/stale.log"
  "${MOETUNE[@]}" trials --limit 0 --json >"$OUT/trials-after.json" 2>/dev/null
  echo "trials after resume and stale: $(grep -c '"id"' "$OUT/trials-after.json") (before: $(grep -c '"id"' "$OUT/trials.json"))"
fi

step "where the sweep's time went"
python3 lab/bench/sweep_timeline.py "$OUT/sweep.db" --sweep "$SWEEP" 2>&1 | tee "$OUT/timeline.log" | tail -40

if [ -n "${gpu1:-}" ]; then
  step "wait for GPU 1 (grid, throughput, model layers), then compare the grid with the sweep"
  wait "$gpu1"; tail -3 "$OUT/gpu-tests.log" 2>/dev/null; grep -v "logging.cc\|^    @" "$OUT/throughput.log" | tail -12
  tail -12 "$OUT/model_layers.log" 2>/dev/null
  [ -s "$OUT/grid.db" ] && python3 lab/bench/compare_grid.py "$OUT/sweep.db" "$OUT/grid.db" --out "$OUT/grid_vs_sweep.json"
fi

step "pack up: merge the databases' WAL, bundle the logs"
merge_wal "$OUT"
rm -f "$OUT/empty.db" "$OUT/sweep.done"
(cd "$OUT" && find . -maxdepth 1 -type f \( -name '*.log' -o -name '*.json' \) ! -name pack.json ! -name grid_vs_sweep.json ! -name throughput.json ! -name model_layers.json ! -name e2e.log -print0 \
  | tar --null -T - -czf logs.tgz --remove-files)
ls -la "$OUT"
step "done"
