#!/usr/bin/env bash
# One GPU against two of one host, in one device call: the same `moetune bench tuner` sweep (grid order,
# so both runs see the same candidates) on a Ray cluster of GPU 0 and 16 cores, then on both GPUs and all
# cores. While the one-GPU run has GPU 0, GPU 1 runs the GPU tests (E2E_GPU_TESTS). Writes one_gpu.json,
# two_gpus.json and multi_gpu.json (throughput ratio, winners' agreement) under $OUT.
#
# On nvidia-h200-x2, from the repository root with .devdeps carried:
#   bash benchmarks/device_multi_gpu.sh
set -uo pipefail
OUT=${OUT:?set OUT to a folder for logs and artifacts}
mkdir -p "$OUT"
source benchmarks/device_env.sh
MODEL=${MG_MODEL:-mixtral-8x7b}
BUCKETS=${MG_BUCKETS:-256,4096}
BUDGET=${MG_BUDGET:-32}
PER_GPU=${MG_WORKERS_PER_GPU:-14}
ROUTING=${MG_ROUTING:-balanced,zipf:1.2}
bench=("${MOETUNE[@]}" bench tuner --model "$MODEL" --buckets "$BUCKETS" --budget "$BUDGET" --routing "$ROUTING" --timeout-s 120)
gpus=$(nvidia-smi -L | wc -l)
cores=$(nproc)
half=$(( cores / gpus ))

step "one GPU: GPU 0 and cores 0-$((half - 1)), $PER_GPU workers; one by one for comparison (${MG_SEQ_BUDGET:-4} per problem)"
CUDA_VISIBLE_DEVICES=0 timeout "${MG_ONE_S:-330}" taskset -c "0-$((half - 1))" "${bench[@]}" --workers "$PER_GPU" \
  --sequential-budget "${MG_SEQ_BUDGET:-4}" --out "$OUT/one_gpu.json" >"$OUT/one_gpu.log" 2>&1 &
one=$!
if [ -n "${E2E_GPU_TESTS:-}" ] && [ "$gpus" -ge 2 ]; then
  step "meanwhile on GPU 1: $E2E_GPU_TESTS"
  (unset XLA_PYTHON_CLIENT_ALLOCATOR; CUDA_VISIBLE_DEVICES=1 timeout "${MG_TESTS_S:-300}" taskset -c "$half-$((cores - 1))" \
    python3 -m pytest $E2E_GPU_TESTS -m gpu -q -p no:cacheprovider -rs >"$OUT/gpu-tests.log" 2>&1; echo "gpu tests rc=$?" >>"$OUT/gpu-tests.log") &
  tests=$!
  wait "$tests"; tail -3 "$OUT/gpu-tests.log"
fi
wait "$one"; echo "one GPU rc=$?"; tail -8 "$OUT/one_gpu.log"

if [ "$gpus" -ge 2 ]; then
  step "$gpus GPUs, all $cores cores, $((PER_GPU * gpus)) workers"
  timeout "${MG_TWO_S:-200}" "${bench[@]}" --workers $((PER_GPU * gpus)) --no-sequential --out "$OUT/two_gpus.json" >"$OUT/two_gpus.log" 2>&1
  echo "two GPUs rc=$?"; tail -6 "$OUT/two_gpus.log"
  python3 benchmarks/compare_clusters.py "$OUT/one_gpu.json" "$OUT/two_gpus.json" --out "$OUT/multi_gpu.json"
fi
step "done"
