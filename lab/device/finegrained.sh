#!/usr/bin/env bash
# The fine-grained MoE paths of the mosaic_gpu backend on one H200, in one device call (8 minutes at most):
#   1. the backend's GPU tests (the fine-grained paths first: the row-tile table, swap-AB tiles, the
#      heuristic at 128-512 experts; then the kernel's and the SwiGLU epilogue's);
#   2. compile time of one candidate at a time at DeepSeek-V3's 256 experts (the heuristic, the next
#      seeds, and the walk schedule beside the table);
#   3. every development shape (lab/bench/dev_shapes.py: Qwen3-30B-A3B, DeepSeek-V3 and its EP=8 shard,
#      Qwen3-Next-80B-A3B, Mixtral-8x7B; T = 1 ... 16384; gate_up and down): the heuristic's config and
#      alternatives beside torch._grouped_mm, tokamax, jax.lax.ragged_dot, cuBLAS and the HBM roofline
#      (lab/bench/bench_gemm.py --models), each output checked against ragged_dot's float32 result;
#   4. with FG_BLOCK_S > 0: the MoE block (lab/bench/bench_block.py) on FG_BLOCK_MODELS at FG_BLOCK_TOKENS
#      against the same block on tokamax's and XLA's GEMMs and in PyTorch, each stage timed;
#   5. with FG_MODEL_S > 0: lab/model/cli.py on FG_MODEL (qwen3_30b_a3b), moetune and XLA paths.
# Each step is time-boxed and logged; a failed step (or one given 0 s) does not stop the next. $OUT gets
# at most 8 files: gpu.txt, install.log (when the bundle is installed), gpu_tests.log, compile_times.json,
# finegrained.json, block.json, model.json and run.log (the tables, printed last as well).
# Knobs: FG_DEADLINE_S (470), FG_TESTS_S (150), FG_COMPILE_S (50), FG_BENCH_S (what is left), FG_MODELS,
# FG_TOKENS, FG_TESTS, FG_BLOCK_*, FG_MODEL_* (FG_MODEL_ARGS: bench_model.py's arguments).
#
# On the GPU machine, from the repository root with .devdeps carried:
#   bash lab/device/finegrained.sh
set -uo pipefail
OUT=${OUT:?set OUT to a folder for logs and artifacts}
mkdir -p "$OUT"
START=$(date +%s)
source lab/device/env.sh
unset XLA_PYTHON_CLIENT_ALLOCATOR  # one process on the GPU at a time here: XLA's own allocator
DEADLINE=$(( START + ${FG_DEADLINE_S:-470} ))
WORK_SUMMARY=$(mktemp)  # the tables, appended to run.log: $OUT brings back at most 8 files
MODELS=${FG_MODELS:-qwen3-30b-a3b,deepseek-v3,deepseek-v3-ep8,qwen3-next-80b-a3b,mixtral-8x7b}
TOKENS=${FG_TOKENS:-1,16,128,1024,4096,16384}
TESTS=${FG_TESTS:-tests/gpu/test_mosaic_gpu_finegrained.py tests/gpu/test_mosaic_gpu_kernel.py tests/gpu/test_mosaic_gpu_swiglu.py}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv >"$OUT/gpu.txt" 2>&1

if [ "${FG_TESTS_S:-150}" -gt 0 ]; then
  step "GPU tests ($(cap ${FG_TESTS_S:-150}) s): $TESTS" | tee -a "$OUT/run.log"
  timeout "$(cap ${FG_TESTS_S:-150})" python3 -m pytest $TESTS -m gpu -q -p no:cacheprovider -rs --durations=15 \
    -o faulthandler_timeout=60 >"$OUT/gpu_tests.log" 2>&1
  echo "gpu tests rc=$? (124: cut at the step's time box)" | tee -a "$OUT/gpu_tests.log" "$OUT/run.log"
  tail -n 4 "$OUT/gpu_tests.log"
fi

if [ "${FG_COMPILE_S:-50}" -gt 0 ]; then
  step "compile time per candidate at G=256 ($(cap ${FG_COMPILE_S:-50}) s)" | tee -a "$OUT/run.log"
  budget=$(cap ${FG_COMPILE_S:-50})
  timeout "$budget" python3 lab/bench/bench_gemm.py --models deepseek-v3 --dev-tokens 1,4096 --compile-times \
    --budget-s $(( budget - 10 )) --out "$OUT/compile_times.json" >>"$OUT/run.log" 2>&1
  echo "compile times rc=$?" | tee -a "$OUT/run.log"
fi

later=$(( ${FG_BLOCK_S:-0} + ${FG_MODEL_S:-0} ))
budget=$(( $(left) - 15 - later )); [ -n "${FG_BENCH_S:-}" ] && [ "$FG_BENCH_S" -lt "$budget" ] && budget=$FG_BENCH_S
step "development shapes ($budget s): $MODELS at T=$TOKENS" | tee -a "$OUT/run.log"
if [ "$budget" -gt 30 ]; then
  timeout "$budget" python3 lab/bench/bench_gemm.py --models "$MODELS" --dev-tokens "$TOKENS" \
    --budget-s $(( budget - 20 )) --out "$OUT/finegrained.json" >>"$OUT/run.log" 2>&1
  echo "benchmark rc=$?" | tee -a "$OUT/run.log"
else
  echo "benchmark skipped: $budget s left" | tee -a "$OUT/run.log"
fi

FG_BLOCK_MODELS=${FG_BLOCK_MODELS:-qwen3-30b-a3b,deepseek-v3-ep8,qwen3-next-80b-a3b,deepseek-v3}
FG_BLOCK_TOKENS=${FG_BLOCK_TOKENS:-1,128,4096}
if [ "${FG_BLOCK_S:-0}" -gt 0 ]; then
  budget=$(cap "$FG_BLOCK_S")
  step "the MoE block ($budget s): $FG_BLOCK_MODELS at T=$FG_BLOCK_TOKENS" | tee -a "$OUT/run.log"
  timeout "$budget" python3 lab/bench/bench_block.py --models ${FG_BLOCK_MODELS//,/ } --tokens ${FG_BLOCK_TOKENS//,/ } \
    --budget-s $(( budget - 25 )) --out "$OUT/block.json" >>"$OUT/run.log" 2>&1
  echo "block rc=$?" | tee -a "$OUT/run.log"
fi
if [ "${FG_MODEL_S:-0}" -gt 0 ]; then
  budget=$(cap "$FG_MODEL_S")
  model_args=${FG_MODEL_ARGS:---model qwen3_30b_a3b --batch 1 --prompt 1024 --gen 32 --paths moetune,ragged --moe-tokens 1,4096 --no-db}
  step "model benchmark ($budget s): $model_args" | tee -a "$OUT/run.log"
  timeout "$budget" python3 -m moetune_lab.model $model_args --out "$OUT/model.json" >>"$OUT/run.log" 2>&1
  echo "model rc=$?" | tee -a "$OUT/run.log"
fi

step "summary" | tee -a "$OUT/run.log"
# From the JSON files, which the benchmark rewrites after every case: a step cut short still shows.
{
  grep -E "passed|failed|error" "$OUT/gpu_tests.log" 2>/dev/null | tail -n 3
  python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path

sys.path.insert(0, "benchmarks")
import bench_gemm

out = Path(sys.argv[1])
if (out / "compile_times.json").exists():
    rows = json.loads((out / "compile_times.json").read_text())["compiles"]
    print(f"\n{'case':36s} {'candidate':12s} {'schedule':8s} {'lower s':>8s} {'compile s':>10s}")
    for r in rows:
        schedule = r.get("config", {}).get("tile_schedule", "-")
        print(f"{r['case']:36s} {r['name']:12s} {schedule:8s} {r.get('lower_s', '-'):>8} {r.get('lower_and_compile_s', r.get('error', '-')):>10}")
if (out / "finegrained.json").exists():
    cases = json.loads((out / "finegrained.json").read_text())["cases"]
    bench_gemm.print_dev_table([c for c in cases if "hbm_roofline_ms" in c])
    failed = [(c["case"], name, m["error"][:80]) for c in cases for name, m in c["methods"].items() if "error" in m]
    print(f"\n{len(failed)} method(s) failed or skipped" + "".join(f"\n  {c} {n}: {e}" for c, n, e in failed[:12]))
PY
} >"$WORK_SUMMARY" 2>&1
cat "$WORK_SUMMARY" >>"$OUT/run.log"
ls -la "$OUT" >>"$OUT/run.log"
cat "$WORK_SUMMARY"
