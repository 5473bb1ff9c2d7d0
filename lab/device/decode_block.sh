#!/usr/bin/env bash
# The fused decode block on one GPU machine, in one device call (DBS_DEADLINE_S, 570 s):
#   1. its GPU tests (tests/gpu/test_fp8_widen_gpu.py, test_decode_block_gpu.py,
#      test_decode_block_op_gpu.py; DBS_TESTS_S, "0" skips);
#   2. a sweep of the block (op moe_decode_block; with DBS_FP8=LAYOUT moe_decode_block_fp8 on K-major
#      float8_e4m3fn weights with scales in LAYOUT; with DBS_K_MAJOR=1 16-bit K-major weights) for DBS_MODELS
#      (lab/bench/dev_shapes.py names: qwen3-30b-a3b qwen3-next-80b-a3b) at DBS_TOKENS (1 8 32), TPE,
#      DBS_BUDGET (40) trials per problem, DBS_WORKERS (8) workers, DBS_SWEEP_S (240) seconds; each
#      sweep times the unfused path first, so a fused winner was measured faster than it;
#   3. the export of its winners ($OUT/pack.json), merged here into the shipped pack (lower time wins), and
#      lab/bench/decode_model_check.py on the sweep: the cost model's estimate of each kernel beside its time;
#   4. after a 16-bit [E, H, 2F] sweep, lab/bench/bench_block.py for DBS_BENCH_MODELS (DBS_MODELS) at
#      DBS_TOKENS on the merged pack, for DBS_BENCH_S (100) seconds, "0" skips: the block as moe_mlp
#      takes it, beside the unfused path, tokamax and torch._grouped_mm; with DBS_SPAN=1 each JAX path's
#      span too (--span: chained as a model's layers run, by the wall clock; two more compiles a path,
#      so fewer cases fit the time box).
# $OUT gets: run.log, gpu-tests.log, pack.json, sweep.db, tune.log, model-check.log, block.json, block.log.
#
# On the GPU machine, from the repository root with .devdeps carried:
#   bash lab/device/decode_block.sh
#   DBS_MODELS=qwen3-next-80b-a3b DBS_TOKENS="1 8" DBS_TESTS_S=0 bash lab/device/decode_block.sh
# Back here: lab/bench/merge_packs.py the shipped pack with $OUT/pack.json, and
#   python3 -m moetune_lab.baselines add-block block.json
set -uo pipefail
OUT=${OUT:?set OUT to a folder for logs and artifacts}
mkdir -p "$OUT"
START=$(date +%s)
source lab/device/env.sh
DEADLINE=$(( START + ${DBS_DEADLINE_S:-570} ))
WORK=$(mktemp -d)
MODELS=${DBS_MODELS:-qwen3-30b-a3b qwen3-next-80b-a3b}
TOKENS=${DBS_TOKENS:-1 8 32}
op=moe_decode_block
[ "${DBS_K_MAJOR:-0}" = 1 ] && op+=",t=1"
[ -n "${DBS_FP8:-}" ] && op="moe_decode_block_fp8,lhs=bfloat16,rhs=float8_e4m3fn,t=1,s=$DBS_FP8"

# Each model's block problem at each T, from the development shapes (H, 2F, E, top_k).
problems=$(python3 - "$op" "$MODELS" "$TOKENS" <<'EOF'
import sys
from moetune_lab.bench import dev_shapes
op, models, tokens = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
for name in models:
    m = dev_shapes.MODELS[name]
    for t in tokens:
        print(f"--problem op={op},k={m.hidden},n={2 * m.ffn},g={m.experts},top_k={m.top_k},m={t}")
EOF
) || { echo "decode_block.sh: unknown model in DBS_MODELS=$MODELS" >&2; exit 2; }

{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv 2>&1
  if [ "${DBS_TESTS_S:-190}" -gt 0 ]; then
    step "GPU tests of the block"
    timeout "$(cap "${DBS_TESTS_S:-190}")" python3 -m pytest tests/gpu/test_fp8_widen_gpu.py \
      tests/gpu/test_decode_block_gpu.py tests/gpu/test_decode_block_op_gpu.py -m gpu -q -p no:cacheprovider -rs >"$OUT/gpu-tests.log" 2>&1
    echo "gpu tests rc=$?"; tail -3 "$OUT/gpu-tests.log"
  fi

  seconds=$(cap "${DBS_SWEEP_S:-240}")
  step "sweep of ${op%%,*}: $MODELS at T = $TOKENS (${seconds} s)"
  # shellcheck disable=SC2086 # one word per --problem and its value
  (export MOETUNE_DB="sqlite:///$WORK/sweep.db"
   timeout $(( seconds + 30 )) "${MOETUNE[@]}" tune $problems \
     --backend mosaic_gpu --strategy tpe --budget "${DBS_BUDGET:-40}" --workers "${DBS_WORKERS:-8}" \
     --minutes "$(python3 -c "print($seconds / 60)")" --json >"$WORK/tune.json" 2>"$OUT/tune.log"
   echo "sweep rc=$?"; grep -v "logging.cc" "$OUT/tune.log" | tail -4
   "${MOETUNE[@]}" export --gpu "NVIDIA H200" --backend mosaic_gpu -o "$OUT/pack.json" 2>&1 | tail -2)
  merge_wal "$WORK"
  cp "$WORK/sweep.db" "$OUT/sweep.db" 2>/dev/null
  # How the cost model's estimate of each kernel compares with the sweep's CUPTI times of it (CPU only).
  python3 lab/bench/decode_model_check.py "$WORK/sweep.db" >"$OUT/model-check.log" 2>&1
  tail -14 "$OUT/model-check.log"

  # bench_block.py times 16-bit [E, H, 2F] blocks: after an FP8 or K-major sweep it has nothing to add.
  if [ "${DBS_BENCH_S:-100}" -gt 0 ] && [ -s "$OUT/pack.json" ] && [ "$op" = moe_decode_block ]; then
    python3 lab/bench/merge_packs.py configs/tuned/nvidia_h200__mosaic_gpu.json "$OUT/pack.json" \
      -o "$WORK/merged.json" 2>&1 | tail -2
    # The copy of the tree here is this run's own: moe_mlp finds the new winners where it finds the pack.
    cp "$WORK/merged.json" configs/tuned/nvidia_h200__mosaic_gpu.json
    budget=$(cap "${DBS_BENCH_S:-100}")
    span=()
    [ "${DBS_SPAN:-0}" = 1 ] && span=(--span)
    step "bench_block.py on the merged pack ($budget s)"
    # shellcheck disable=SC2086 # one word per model and per T
    (unset XLA_PYTHON_CLIENT_ALLOCATOR
     timeout "$budget" python3 lab/bench/bench_block.py --models ${DBS_BENCH_MODELS:-$MODELS} --tokens $TOKENS \
       --methods moetune moetune_unfused moetune_fused tokamax torch_grouped_mm "${span[@]}" \
       --budget-s $(( budget - 20 )) --out "$OUT/block.json" >"$OUT/block.log" 2>&1
     echo "bench rc=$?"; grep -v "logging.cc" "$OUT/block.log" | tail -12)
  fi
} 2>&1 | tee "$OUT/run.log"
