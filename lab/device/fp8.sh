#!/usr/bin/env bash
# The FP8 kernels on one H200 in one device call: their GPU tests, then bench_fp8.py's cases against
# torch's FP8 and bf16 grouped GEMMs. Knobs: FP8_TESTS_S (200; 0 skips the tests), FP8_TESTS_K (a pytest
# -k expression choosing tests), FP8_BENCH_S (330), FP8_MODELS, FP8_TOKENS, FP8_LAYOUTS, FP8_GEMMS
# (bench_fp8.py's defaults when unset).
#
# On the GPU machine, from the repository root with .devdeps carried:
#   bash lab/device/fp8.sh
set -uo pipefail
OUT=${OUT:?set OUT to a folder for logs and artifacts}
mkdir -p "$OUT"
source lab/device/env.sh
unset XLA_PYTHON_CLIENT_ALLOCATOR  # one process on the GPU at a time here: XLA's own allocator
if [ "${FP8_TESTS_S:-200}" != 0 ]; then
  step "FP8 GPU tests (${FP8_TESTS_S:-200} s)" | tee -a "$OUT/run.log"
  select=()
  [ -n "${FP8_TESTS_K:-}" ] && select=(-k "$FP8_TESTS_K")
  timeout "${FP8_TESTS_S:-200}" python3 -m pytest tests/gpu/test_mosaic_gpu_fp8.py -m gpu -q -p no:cacheprovider \
    "${select[@]}" -rfEs --junitxml "$OUT/gpu_tests_fp8.xml" -o faulthandler_timeout=60 >"$OUT/gpu_tests_fp8.log" 2>&1
  rc=$?
  echo "fp8 gpu tests rc=$rc (124: cut at the time box)" | tee -a "$OUT/run.log"
  # After any failed or cut test the staggered consumers are not timed: their turns are the newest
  # synchronisation here, and a kernel that hangs would hold the benchmark until the call's end.
  if [ "$rc" != 0 ]; then
    echo "bench_fp8 skips the staggered variants" | tee -a "$OUT/run.log"
    FP8_SKIP_VARIANTS=staggered,lockstep
  fi
  tail -n 30 "$OUT/gpu_tests_fp8.log"
fi
step "bench_fp8 (${FP8_BENCH_S:-330} s)" | tee -a "$OUT/run.log"
args=(--out "$OUT/fp8.json" --budget-s "${FP8_BENCH_S:-330}")
[ -n "${FP8_MODELS:-}" ] && args+=(--models "$FP8_MODELS")
[ -n "${FP8_TOKENS:-}" ] && args+=(--tokens "$FP8_TOKENS")
[ -n "${FP8_LAYOUTS:-}" ] && args+=(--layouts "$FP8_LAYOUTS")
[ -n "${FP8_GEMMS:-}" ] && args+=(--gemms "$FP8_GEMMS")
[ -n "${FP8_SKIP_VARIANTS:-}" ] && args+=(--skip-variants "$FP8_SKIP_VARIANTS")
python3 lab/bench/bench_fp8.py "${args[@]}" 2>&1 | tee "$OUT/bench_fp8.log" | grep -v "^WARNING\|^I0000\|^W0000"
