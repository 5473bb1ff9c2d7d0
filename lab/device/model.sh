#!/usr/bin/env bash
# The model benchmark on a GPU machine, in one run of at most 10 minutes:
#   GPU 0: the model benchmark (lab/model/cli.py: prefill and decode tokens/s and the MoE layer alone,
#          by default for Mixtral-8x7B on the dense, moetune and XLA ragged_dot paths, with parity against
#          dense);
#   GPU 1 (on a host with two): the GPU tests (tests/gpu).
# On a one-GPU machine the GPU 1 half runs after the model benchmark, in what time is left.
# Knobs: MODEL (mixtral_8x7b), MODEL_BATCH (1), MODEL_PROMPT (2048), MODEL_GEN (128), MODEL_S (480),
# TESTS ("tests/gpu"); and, each left to the benchmark's default when unset: MODEL_PATHS (--paths, e.g.
# dense,moetune,moetune_fused,ragged: moetune_fused is the moetune path on the fused decode block),
# MODEL_FP8 (--fp8 LAYOUT: the FP8 model too), MODEL_LAYERS (--layers), MODEL_MOE_TOKENS (--moe-tokens),
# MODEL_DECODE_BLOCK (--decode-block: xla keeps the moetune run unfused beside moetune_fused);
# GPU1_CMD replaces the GPU 1 half with one command (its output in $OUT/gpu1.log), e.g.
#   GPU1_CMD='python3 lab/bench/bench_gemm.py --out $OUT/bench_gemm.json --budget-s 420'
#   bash lab/device/model.sh          # with .devdeps carried; logs and JSON under $OUT
#   MODEL=qwen3_30b_a3b MODEL_PROMPT=512 MODEL_PATHS=moetune,moetune_fused,ragged \
#     MODEL_MOE_TOKENS=1 MODEL_DECODE_BLOCK=xla MODEL_FP8=row_channel GPU1_CMD=true bash lab/device/model.sh
set -uo pipefail
OUT=${OUT:?set OUT to a folder for logs and artifacts}
mkdir -p "$OUT"
source lab/device/env.sh
unset XLA_PYTHON_CLIENT_ALLOCATOR  # one process per GPU here: XLA's own allocator
DEADLINE=$(( $(date +%s) + ${MODEL_DEADLINE_S:-570} ))
gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c GPU)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv >"$OUT/gpu.txt" 2>&1

second_half() {
  step "GPU tests: ${TESTS:-tests/gpu}"
  timeout "$(cap 600)" python3 -m pytest ${TESTS:-tests/gpu} -m gpu -v -p no:cacheprovider -rs >"$OUT/gpu-tests.log" 2>&1
  echo "gpu tests rc=$?" >>"$OUT/gpu-tests.log"
}

if [ -n "${GPU1_CMD:-}" ]; then
  second_half() {
    step "GPU 1: $GPU1_CMD"
    (export OUT; timeout "$(cap 600)" bash -c "$GPU1_CMD") >"$OUT/gpu1.log" 2>&1
    echo "gpu1 rc=$?" >>"$OUT/gpu1.log"
  }
fi
if [ "$gpus" -ge 2 ]; then
  (export CUDA_VISIBLE_DEVICES=1; second_half) &
  other=$!
fi
model_args=(--model "${MODEL:-mixtral_8x7b}" --batch "${MODEL_BATCH:-1}" --prompt "${MODEL_PROMPT:-2048}")
model_args+=(--gen "${MODEL_GEN:-128}" --no-db --out "$OUT/model.json")
[ -n "${MODEL_PATHS:-}" ] && model_args+=(--paths "$MODEL_PATHS")
[ -n "${MODEL_FP8:-}" ] && model_args+=(--fp8 "$MODEL_FP8")
[ -n "${MODEL_LAYERS:-}" ] && model_args+=(--layers "$MODEL_LAYERS")
[ -n "${MODEL_MOE_TOKENS:-}" ] && model_args+=(--moe-tokens "$MODEL_MOE_TOKENS")
[ -n "${MODEL_DECODE_BLOCK:-}" ] && model_args+=(--decode-block "$MODEL_DECODE_BLOCK")
step "model benchmark: ${model_args[*]}"
CUDA_VISIBLE_DEVICES=0 timeout "$(cap ${MODEL_S:-480})" python3 -m moetune_lab.model "${model_args[@]}" \
  >"$OUT/model.log" 2>&1
echo "model rc=$?" >>"$OUT/model.log"
if [ "$gpus" -ge 2 ]; then wait "$other"; else CUDA_VISIBLE_DEVICES=0 second_half; fi
tail -n 30 "$OUT/model.log"
if [ -n "${GPU1_CMD:-}" ]; then tail -n 45 "$OUT/gpu1.log"; else tail -n 40 "$OUT/gpu-tests.log"; fi
