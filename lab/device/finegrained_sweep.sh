#!/usr/bin/env bash
# The fine-grained development models tuned on one GPU machine, in one device call (FGS_DEADLINE_S, 570 s):
#   1. FGS_MODEL's whole model sweep (qwen3-30b-a3b: every token bucket 1..16384 or FGS_BUCKETS, both GEMMs;
#      TPE, FGS_BUDGET trials per problem, FGS_WORKERS workers; "" skips), its throughput from its database;
#   2. configs/sweeps/finegrained.yaml for FGS_FILE_MODELS (deepseek-v3-ep8,qwen3-next-80b-a3b; "" skips)
#      at its token counts or FGS_FILE_BUCKETS;
#   3. the same file for FGS_BIG_MODELS (deepseek-v3; "" skips) on FGS_BIG_WORKERS (4) workers: a worker
#      keeps a problem's inputs within its share of the GPU's memory, and DeepSeek-V3's 256 experts' gate_up
#      weights alone are 15 GB, past a 14th of an H200's;
#   4. the pack export of every winner, each sweep's timeline (lab/bench/sweep_timeline.py);
#   5. with FGS_BENCH_S > 0: lab/bench/bench_gemm.py --models FGS_BENCH_MODELS on the shipped pack merged
#      with the new one (heuristic, cost-model seeds and the tuned winner beside the peers).
# With FGS_FP8=LAYOUT every sweep tunes the models' FP8 ops instead (`moetune tune --fp8 LAYOUT`).
# Each sweep is time-boxed (FGS_*_S seconds of --minutes, killed 40 s after); a failed step does not stop
# the next. $OUT gets at most 8 files: run.log, pack.json, sweep.db, timeline.txt, finegrained.json, logs.tgz.
#
# On the GPU machine, from the repository root with .devdeps carried:
#   bash lab/device/finegrained_sweep.sh
# A CPU rehearsal of the same plumbing:
#   OUT=$(mktemp -d) FGS_MODEL=tiny FGS_BUCKETS=1,64 FGS_FILE_MODELS=tiny FGS_FILE_BUCKETS=1,64 FGS_BIG_MODELS= FGS_BACKEND=xla \
#     FGS_GPU=cpu FGS_BENCH_S=0 bash lab/device/finegrained_sweep.sh
set -uo pipefail
OUT=${OUT:?set OUT to a folder for logs and artifacts}
mkdir -p "$OUT"
START=$(date +%s)
source lab/device/env.sh
WORK=$(mktemp -d)  # everything but the few files $OUT brings back
export MOETUNE_DB="sqlite:///$WORK/sweep.db"
DEADLINE=$(( START + ${FGS_DEADLINE_S:-570} ))
BACKEND=${FGS_BACKEND:-mosaic_gpu}
GPU_KIND=${FGS_GPU:-NVIDIA H200}
common=(--backend "$BACKEND" --strategy tpe --budget "${FGS_BUDGET:-16}" --routing zipf:0 --no-baseline --json)
[ -n "${FGS_FP8:-}" ] && common+=(--fp8 "$FGS_FP8")  # every sweep on FP8 experts with scales in FGS_FP8

# tune NAME SECONDS WORKERS ARGS...: a sweep with --minutes of SECONDS, killed 40 s after, into $WORK/NAME.*
tune() {
  local name=$1 seconds=$2 workers=$3 t0 rc
  shift 3
  [ "$(left)" -lt $(( seconds + 40 )) ] && seconds=$(( $(left) - 40 ))
  if [ "$seconds" -lt 20 ]; then echo "$name skipped: $(left) s left"; return; fi
  step "sweep $name: $* (${seconds} s, $workers workers)"
  t0=$(date +%s)
  timeout $(( seconds + 40 )) "${MOETUNE[@]}" tune "$@" "${common[@]}" --workers "$workers" \
    --minutes "$(python3 -c "print($seconds / 60)")" >"$WORK/$name.json" 2>"$WORK/$name.log"
  rc=$?
  echo "$name rc=$rc in $(( $(date +%s) - t0 )) s"; grep -v "logging.cc\|^    @" "$WORK/$name.log" | tail -3
}

{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv 2>&1
  model=${FGS_MODEL-qwen3-30b-a3b}
  [ -n "$model" ] && tune model "${FGS_MODEL_S:-210}" "${FGS_WORKERS:-14}" --model "$model" \
    ${FGS_BUCKETS:+--buckets "$FGS_BUCKETS"}
  file_models=${FGS_FILE_MODELS-deepseek-v3-ep8,qwen3-next-80b-a3b}
  big_models=${FGS_BIG_MODELS-deepseek-v3}
  [ -n "$file_models" ] && tune file "${FGS_FILE_S:-170}" "${FGS_WORKERS:-14}" --sweep configs/sweeps/finegrained.yaml \
    $(printf -- '--model %s ' ${file_models//,/ }) ${FGS_FILE_BUCKETS:+--buckets "$FGS_FILE_BUCKETS"}
  [ -n "$big_models" ] && tune big "${FGS_BIG_S:-170}" "${FGS_BIG_WORKERS:-4}" --sweep configs/sweeps/finegrained.yaml \
    $(printf -- '--model %s ' ${big_models//,/ }) ${FGS_FILE_BUCKETS:+--buckets "$FGS_FILE_BUCKETS"}

  step "export, timelines"
  "${MOETUNE[@]}" export --gpu "$GPU_KIND" --backend "$BACKEND" -o "$OUT/pack.json" 2>&1 | tail -2
  for id in $(python3 -c "
import sqlite3, sys
print(' '.join(str(r[0]) for r in sqlite3.connect(sys.argv[1]).execute('select id from sweeps order by id')))
" "$WORK/sweep.db"); do
    python3 lab/bench/sweep_timeline.py "$WORK/sweep.db" --sweep "$id" 2>&1 | tail -25
  done >"$OUT/timeline.txt"
  grep -i "throughput\|trials" "$OUT/timeline.txt" | head -12

  if [ "${FGS_BENCH_S:-0}" -gt 0 ] && [ -s "$OUT/pack.json" ]; then
    budget=$(( $(left) - 20 )); [ "$budget" -gt "$FGS_BENCH_S" ] && budget=$FGS_BENCH_S
    step "bench_gemm.py --models ${FGS_BENCH_MODELS:-qwen3-30b-a3b} on the shipped pack and this one ($budget s)"
    python3 lab/bench/merge_packs.py configs/tuned/nvidia_h200__mosaic_gpu.json "$OUT/pack.json" -o "$WORK/merged.json" 2>&1 | tail -2
    (unset XLA_PYTHON_CLIENT_ALLOCATOR MOETUNE_DB
     timeout "$budget" python3 lab/bench/bench_gemm.py --models "${FGS_BENCH_MODELS:-qwen3-30b-a3b}" \
       --dev-tokens "${FGS_BENCH_TOKENS:-1,16,128,1024,4096,16384}" --pack "$WORK/merged.json" \
       --budget-s $(( budget - 15 )) --out "$OUT/finegrained.json" >"$WORK/bench.log" 2>&1
     echo "bench rc=$?"; grep -v "logging.cc" "$WORK/bench.log" | tail -40)
  fi
} 2>&1 | tee "$OUT/run.log"

merge_wal "$WORK"
cp "$WORK/sweep.db" "$OUT/sweep.db" 2>/dev/null
(cd "$WORK" && tar czf "$OUT/logs.tgz" --exclude sweep.db --exclude merged.json . 2>/dev/null)
ls -la "$OUT" | tee -a "$OUT/run.log"
