#!/usr/bin/env bash
# The training example (examples/train_moe.py) on one GPU, in one device call (9 minutes at most): one
# config trained with --backend auto (moetune's dispatch) and with --backend xla (jax.lax.ragged_dot),
# each run's --json kept, then `baselines.py add-example` of the two into a copy of the baselines files
# under $OUT/baselines/ (the entry train_example/<config>; copy it over lab/baselines/ to keep it).
# The default config is the example's model at dim 512, 8 heads, ffn 1024 (its own defaults, dim 64 and
# ffn 128, are bound by launch overhead, not by its GEMMs), batch 64 x 512 tokens, 300 steps.
# Each run is time-boxed; unless both succeed no baselines copy is made. $OUT gets gpu.txt, install.log,
# train_auto.json, train_xla.json (and their .log: the loss lines), baselines/, run.log.
# Knobs: TE_BATCH (64), TE_SEQ (512), TE_STEPS (300), TE_MODEL ("--dim 512 --heads 8 --ffn 1024": any of
# the example's model flags), TE_MOE_DTYPE (bfloat16: what the Hopper kernels serve), TE_RUN_S (250,
# each run), TE_DEADLINE_S (540).
#
# On the GPU machine, from the repository root with .devdeps carried (optax: the image's or the bundle's):
#   bash lab/device/train_example.sh
set -uo pipefail
OUT=${OUT:?set OUT to a folder for logs and artifacts}
mkdir -p "$OUT"
START=$(date +%s)
source lab/device/env.sh
unset XLA_PYTHON_CLIENT_ALLOCATOR  # one process on the GPU at a time here: XLA's own allocator
python3 -c 'import optax' || {
  echo "train_example.sh: no optax; rebuild .devdeps with it: ../shared/tools/device-bundle platformdirs optax absl-py" >&2
  exit 1
}
DEADLINE=$(( START + ${TE_DEADLINE_S:-540} ))
MODEL=${TE_MODEL:-"--dim 512 --heads 8 --ffn 1024"}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv >"$OUT/gpu.txt" 2>&1

ok=1
for backend in auto xla; do
  step "train_moe.py --backend $backend ($(cap ${TE_RUN_S:-250}) s)" | tee -a "$OUT/run.log"
  # shellcheck disable=SC2086  # MODEL is a list of flags
  timeout "$(cap ${TE_RUN_S:-250})" python3 examples/train_moe.py --backend "$backend" \
    --batch "${TE_BATCH:-64}" --seq "${TE_SEQ:-512}" --steps "${TE_STEPS:-300}" \
    $MODEL --moe-dtype "${TE_MOE_DTYPE:-bfloat16}" --log-every 50 --json \
    >"$OUT/train_$backend.json" 2>"$OUT/train_$backend.log"
  rc=$?
  echo "$backend rc=$rc (124: cut at the run's time box)" | tee -a "$OUT/run.log"
  grep -v "^WARNING\|^W[0-9]" "$OUT/train_$backend.log" | tail -n 12 | tee -a "$OUT/run.log"
  [ "$rc" -eq 0 ] || ok=0
done

if [ "$ok" -eq 1 ]; then
  step "baselines.py add-example" | tee -a "$OUT/run.log"
  mkdir -p "$OUT/baselines" && cp lab/baselines/*.json "$OUT/baselines/"
  key=$(python3 -c 'import json, sys; sys.path.insert(0, "benchmarks"); import baselines
print(baselines.gpu_key(json.load(open(sys.argv[1]))["device"]["device_kind"]))' "$OUT/train_auto.json")
  python3 -m moetune_lab.baselines add-example "$OUT/train_auto.json" "$OUT/train_xla.json" \
    --file "$OUT/baselines/$key.json" 2>&1 | tee -a "$OUT/run.log"
  echo "add-example rc=${PIPESTATUS[0]}" | tee -a "$OUT/run.log"
  python3 - "$OUT/train_auto.json" "$OUT/train_xla.json" <<'EOF' | tee -a "$OUT/run.log"
import json, sys
for path in sys.argv[1:]:
    run = json.load(open(path))
    print(f"{run['backend']}: median step {run['step_s'] * 1e3:.2f} ms over {len(run['step_times_s'])} steps, "
          f"{run['tokens_per_s']:.0f} tokens/s, first step {run['first_step_s']:.1f} s, final loss {run['losses'][-1]:.4f}")
    for kernel in run.get("kernels", []):
        print(f"  {kernel['backend']:10s} {kernel['source']:12s} {kernel['problem']}")
EOF
fi
