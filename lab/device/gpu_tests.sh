#!/usr/bin/env bash
# One shard of the GPU tests (tests/gpu, marker gpu) on one H200, within one device call: the whole suite
# takes longer than one call may run, so it is split by test id (pytest-shard: a test's shard is the hash
# of its id, the same on every run) and each call runs one shard. The JUnit file of each shard carries its
# counts; `python3 lab/bench/gpu_test_counts.py $OUT/*/gpu_tests_*.xml` adds them up.
# Knobs: GPU_SHARD (0), GPU_SHARDS (4), GPU_TESTS_S (540).
#
# On the GPU machine, from the repository root with .devdeps carried:
#   GPU_SHARD=0 bash lab/device/gpu_tests.sh
set -uo pipefail
OUT=${OUT:?set OUT to a folder for logs and artifacts}
mkdir -p "$OUT"
source lab/device/env.sh
unset XLA_PYTHON_CLIENT_ALLOCATOR  # one process on the GPU at a time here: XLA's own allocator
python3 -c 'import pytest_shard' 2>/dev/null || {
  echo "gpu_tests.sh: .devdeps lacks pytest-shard; rebuild: ../shared/tools/device-bundle platformdirs pytest-shard" >&2
  exit 1
}
shard=${GPU_SHARD:-0} shards=${GPU_SHARDS:-4}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv >"$OUT/gpu.txt" 2>&1
step "GPU tests, shard $shard of $shards (${GPU_TESTS_S:-540} s)" | tee -a "$OUT/run.log"
timeout "${GPU_TESTS_S:-540}" python3 -m pytest tests/gpu -m gpu -q -p no:cacheprovider -rfEs --durations=20 \
  --shard-id "$shard" --num-shards "$shards" --junitxml "$OUT/gpu_tests_${shard}_of_${shards}.xml" \
  -o faulthandler_timeout=60 >"$OUT/gpu_tests_${shard}.log" 2>&1
echo "gpu tests shard $shard rc=$? (124: cut at the time box)" | tee -a "$OUT/gpu_tests_${shard}.log" "$OUT/run.log"
tail -n 40 "$OUT/gpu_tests_${shard}.log"
