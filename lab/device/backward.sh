#!/usr/bin/env bash
# The backward pass's kernels on one H200, in one device call (9 minutes at most):
#   1. the weight-gradient kernel's GPU tests and the mosaic_gpu backend contract (which now serves it);
#   2. lab/bench/bench_backward.py: the weight gradient of the development shapes (Mixtral-8x7B,
#      DeepSeek-V3, Qwen3-30B-A3B; gate_up and down; T = 4096, 16384) against XLA's ragged_dot_general
#      and torch._grouped_mm's wgrad form, the heuristic beside the cost model's next configs, and each
#      shape on a half-full buffer, and the input gradient (dlhs) beside the forward op of its shape;
#   3. lab/bench/bench_layer_grad.py: the MoE layer's forward and backward at T=4096 (Mixtral-8x7B,
#      Qwen3-30B-A3B) against the XLA ragged_dot layer and a torch._grouped_mm layer.
# Each step is time-boxed; a failed step does not stop the next. $OUT gets gpu.txt, install.log,
# gpu_tests.log, drhs.json, layer.json, run.log. Knobs: BW_DEADLINE_S (530), BW_TESTS_S (170),
# BW_DRHS_S (300), BW_MODELS, BW_TOKENS, BW_RANKED (3).
#
# On the GPU machine, from the repository root with .devdeps carried:
#   bash lab/device/backward.sh
set -uo pipefail
OUT=${OUT:?set OUT to a folder for logs and artifacts}
mkdir -p "$OUT"
START=$(date +%s)
source lab/device/env.sh
unset XLA_PYTHON_CLIENT_ALLOCATOR  # one process on the GPU at a time here: XLA's own allocator
DEADLINE=$(( START + ${BW_DEADLINE_S:-530} ))
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv >"$OUT/gpu.txt" 2>&1

if [ "${BW_TESTS_S:-170}" -gt 0 ]; then  # 0: no tests (device_gpu_tests.sh runs the whole suite)
  step "GPU tests ($(cap ${BW_TESTS_S:-170}) s)" | tee -a "$OUT/run.log"
  timeout "$(cap ${BW_TESTS_S:-170})" python3 -m pytest tests/gpu/test_mosaic_gpu_drhs.py \
    tests/gpu/test_mosaic_gpu_contract.py -m gpu -q -p no:cacheprovider -rs --durations=10 \
    -o faulthandler_timeout=60 >"$OUT/gpu_tests.log" 2>&1
  echo "gpu tests rc=$? (124: cut at the step's time box)" | tee -a "$OUT/gpu_tests.log" "$OUT/run.log"
  tail -n 30 "$OUT/gpu_tests.log"
fi

step "weight gradient benchmark ($(cap ${BW_DRHS_S:-300}) s)" | tee -a "$OUT/run.log"
timeout "$(cap ${BW_DRHS_S:-300})" python3 lab/bench/bench_backward.py --models ${BW_MODELS:-mixtral-8x7b deepseek-v3 qwen3-30b-a3b} \
  --tokens ${BW_TOKENS:-4096 16384} --ranked "${BW_RANKED:-3}" --half-full --dlhs --out "$OUT/drhs.json" 2>&1 \
  | grep -v "^WARNING\|^W[0-9]" | tee -a "$OUT/run.log"
echo "bench rc=${PIPESTATUS[0]}" | tee -a "$OUT/run.log"

step "MoE layer forward + backward ($(left) s)" | tee -a "$OUT/run.log"
timeout "$(left)" python3 lab/bench/bench_layer_grad.py --out "$OUT/layer.json" 2>&1 \
  | grep -v "^WARNING\|^W[0-9]" | tee -a "$OUT/run.log"
echo "layer rc=${PIPESTATUS[0]}" | tee -a "$OUT/run.log"
