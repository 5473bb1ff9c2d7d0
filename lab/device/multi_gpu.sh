#!/usr/bin/env bash
# One GPU against two of one host, in one run: the Mixtral-8x7B sweep (every bucket,
# both GEMMs, both routings) on a Ray cluster of GPU 0 and half the cores, then the same sweep on one
# cluster of both GPUs and all cores. Both use the seeded random strategy, so both try the same
# candidates (TPE's next candidate depends on the order results come back, which the GPU count changes)
# and their winners and every config's time can be compared; both leave out the XLA baseline, which is
# not candidate work. While the one-GPU sweep has GPU 0, GPU 1 runs MG_GPU1_JOB:
#   check (default): the same sweep with its XLA baselines on the buckets MG_CHECK_BUCKETS, whose
#          configs' times are compared with the one-GPU sweep's (a baseline compiled beside a timing
#          disturbs it; see tuner/candidate.py);
#   bench: `moetune bench tuner`, Ray against one by one on the same candidates;
#   command: the shell command MG_GPU1_CMD (another measurement that needs a GPU, e.g. bench_model.py),
#          its output in gpu1.log.
# Writes one_gpu.db, two_gpus.db, multi_gpu.json (lab/bench/compare_clusters.py: throughput ratio,
# winners' agreement, same-config times), and check.db with check_vs_one.json, or throughput.json.
#
# On a host with two GPUs, from the repository root with .devdeps carried:
#   bash lab/device/multi_gpu.sh
# Knobs: MG_MODEL, MG_BUDGET (16), MG_PER_GPU (14 workers), MG_ONE_S (300), MG_TWO_S (200),
#        MG_CHECK_BUCKETS (512,1024,2048,4096,8192), MG_BENCH_BUCKETS (64,256), MG_BENCH_BUDGET (40),
#        MG_SEQ_BUDGET (4).
set -uo pipefail
OUT=${OUT:?set OUT to a folder for logs and artifacts}
mkdir -p "$OUT"
source lab/device/env.sh
MODEL=${MG_MODEL:-mixtral-8x7b}
PER_GPU=${MG_PER_GPU:-14}
ROUTING=${MG_ROUTING:-balanced,zipf:1.2}
sweep=("${MOETUNE[@]}" tune --model "$MODEL" --backend mosaic_gpu --strategy random --budget "${MG_BUDGET:-16}"
  --routing "$ROUTING" --timeout-s 120 --json)
no_baseline=(--no-baseline)
MG_ONE_S=${MG_ONE_S:-300}
gpus=$(nvidia-smi -L | wc -l)
cores=$(nproc)
half=$(( cores / gpus ))

step "one GPU: GPU 0 and cores 0-$((half - 1)), $PER_GPU workers"
MOETUNE_DB="sqlite:///$OUT/one_gpu.db" CUDA_VISIBLE_DEVICES=0 timeout "$MG_ONE_S" taskset -c "0-$((half - 1))" \
  "${sweep[@]}" "${no_baseline[@]}" --workers "$PER_GPU" --minutes "$(python3 -c "print($MG_ONE_S / 60 - 0.5)")" \
  >"$OUT/one_gpu.json" 2>"$OUT/one_gpu.log" &
one=$!
if [ "$gpus" -ge 2 ]; then
  on_gpu1=(env CUDA_VISIBLE_DEVICES=1 timeout "$MG_ONE_S" taskset -c "$half-$((cores - 1))")
  if [ "${MG_GPU1_JOB:-check}" = check ]; then
    step "meanwhile on GPU 1 and cores $half-$((cores - 1)): the same sweep with its XLA baselines, buckets ${MG_CHECK_BUCKETS:-512,1024,2048,4096,8192}"
    MOETUNE_DB="sqlite:///$OUT/check.db" "${on_gpu1[@]}" "${sweep[@]}" --buckets "${MG_CHECK_BUCKETS:-512,1024,2048,4096,8192}" \
      --workers "$PER_GPU" --minutes "$(python3 -c "print($MG_ONE_S / 60 - 0.5)")" >"$OUT/check.json" 2>"$OUT/check.log"
    echo "check sweep rc=$?"; grep -v "logging.cc\|^    @" "$OUT/check.log" | tail -2
  elif [ "${MG_GPU1_JOB}" = command ]; then
    step "meanwhile on GPU 1 and cores $half-$((cores - 1)): ${MG_GPU1_CMD:?set MG_GPU1_CMD}"
    "${on_gpu1[@]}" bash -c "$MG_GPU1_CMD" >"$OUT/gpu1.log" 2>&1
    echo "GPU 1 command rc=$?"; tail -25 "$OUT/gpu1.log"
  else
    step "meanwhile on GPU 1 and cores $half-$((cores - 1)): bench tuner, Ray against one by one"
    MOETUNE_DB="sqlite:///$OUT/bench.db" "${on_gpu1[@]}" "${MOETUNE[@]}" bench tuner --model "$MODEL" \
      --buckets "${MG_BENCH_BUCKETS:-64,256}" --backend mosaic_gpu --budget "${MG_BENCH_BUDGET:-40}" \
      --sequential-budget "${MG_SEQ_BUDGET:-4}" --routing "$ROUTING" --workers "$PER_GPU" --timeout-s 120 \
      --out "$OUT/throughput.json" >"$OUT/throughput.log" 2>&1
    echo "bench tuner rc=$?"; grep -v "logging.cc\|^    @" "$OUT/throughput.log" | tail -8
  fi
fi
wait "$one"; echo "one GPU rc=$?"; grep -v "logging.cc\|^    @" "$OUT/one_gpu.log" | tail -3

if [ "$gpus" -ge 2 ]; then
  step "$gpus GPUs, all $cores cores, $((PER_GPU * gpus)) workers"
  MOETUNE_DB="sqlite:///$OUT/two_gpus.db" timeout "${MG_TWO_S:-200}" "${sweep[@]}" "${no_baseline[@]}" --workers $((PER_GPU * gpus)) \
    --minutes "$(python3 -c "print(${MG_TWO_S:-200} / 60 - 0.5)")" >"$OUT/two_gpus.json" 2>"$OUT/two_gpus.log"
  echo "two GPUs rc=$?"; grep -v "logging.cc\|^    @" "$OUT/two_gpus.log" | tail -3
  python3 lab/bench/compare_clusters.py "$OUT/one_gpu.db" "$OUT/two_gpus.db" --out "$OUT/multi_gpu.json" | head -3
fi
if [ -s "$OUT/check.db" ]; then
  step "the sweep with baselines (GPU 1) against the one-GPU sweep without (GPU 0), config by config"
  python3 lab/bench/compare_clusters.py "$OUT/check.db" "$OUT/one_gpu.db" --out "$OUT/check_vs_one.json"
fi
merge_wal "$OUT"
python3 lab/bench/sweep_timeline.py "$OUT/one_gpu.db" --sweep 1 >"$OUT/timeline_one.log" 2>&1
[ -s "$OUT/two_gpus.db" ] && python3 lab/bench/sweep_timeline.py "$OUT/two_gpus.db" --sweep 1 >"$OUT/timeline_two.log" 2>&1
for f in "$OUT"/timeline_*.log; do echo "== $f"; head -3 "$f"; grep -A4 "device lanes" "$f"; done
(cd "$OUT" && tar czf logs.tgz --remove-files $(ls ./*.log one_gpu.json two_gpus.json check.json bench.db 2>/dev/null | grep -v '^./mg.log$'))
ls -la "$OUT"
step "done"
