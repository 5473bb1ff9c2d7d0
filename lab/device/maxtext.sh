#!/usr/bin/env bash
# MaxText's MoE with moetune's plug-in against MaxText's default GPU route (megablox: false, which is
# jax.lax.ragged_dot), on one H200, in one device call (9.5 minutes at most): lab/bench/bench_maxtext.py
#   1. serve: the model in MaxText's inference engine, prefill of a 2048-token prompt and batch-1 decode,
#      tokens/s and logits parity (MT_SERVE_LAYERS of the model's layers: the engine materializes the
#      weights twice while it loads them, so half of the GPU's memory is what a model may take);
#   2. layer and step: one routed MoE layer at decode, prefill and 4096 training tokens, and a training
#      step (loss and gradients) of MT_STEP_LAYERS layers;
#   3. the same layer (training) and step against use_tokamax_gmm=true, MaxText's tokamax route.
# MT_MODEL picks the config: mixtral (MaxText's configs/gpu/models/mixtral_8x7b.yml) or qwen3
# (model_name=qwen3-30b-a3b). Both run with attention=dot_product (the GPU config's cudnn_flash_te needs
# Transformer Engine) and scan_layers=true with param_scan_axis=0 (one layer compiled, not 32; the layer
# axis first, so no step transposes the stacked weights), bf16 weights.
# MT_TRAIN_TOKENS (4096) sets the training tokens (max_target_length); MT_SERVE_S, MT_LAYER_S and
# MT_TOKAMAX_S time-box the three steps (0 skips one).
# $OUT gets gpu.txt, install.log, serve.json, layer.json, tokamax.json, run.log.
#
# On the GPU machine, from the repository root with .mtdeps carried (lab/device/maxtext_bundle.sh):
#   MT_MODEL=mixtral bash lab/device/maxtext.sh
set -uo pipefail
OUT=${OUT:?set OUT to a folder for logs and artifacts}
mkdir -p "$OUT"
START=$(date +%s)
DEADLINE=$(( START + ${MT_DEADLINE_S:-570} ))
source lab/device/timebox.sh
site=$(mktemp -d) && tar xJf .mtdeps/site.tar.xz -C "$site" && export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-deps --no-build-isolation -e . -e lab >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
python3 -c 'import maxtext.layers.moe, maxtext.inference.maxengine.maxengine, moetune.integrations.maxtext' \
  >>"$OUT/install.log" 2>&1 || { tail -n 20 "$OUT/install.log"; exit 1; }
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv >"$OUT/gpu.txt" 2>&1
configs=$(python3 -c 'import maxtext, os; print(os.path.join(os.path.dirname(maxtext.__file__), "configs"))')
case "${MT_MODEL:-mixtral}" in
  mixtral) MODEL=("$configs/gpu/models/mixtral_8x7b.yml"); SERVE_LAYERS=${MT_SERVE_LAYERS:-16} ;;
  qwen3) MODEL=("$configs/base.yml" model_name=qwen3-30b-a3b megablox=false); SERVE_LAYERS=${MT_SERVE_LAYERS:-24} ;;
  *) echo "MT_MODEL: mixtral or qwen3" >&2; exit 2 ;;
esac
COMMON=(override_model_config=true attention=dot_product scan_layers=true param_scan_axis=0
        weight_dtype=bfloat16 enable_checkpointing=false skip_jax_distributed_system=true per_device_batch_size=1 max_target_length="${MT_TRAIN_TOKENS:-4096}"
        max_prefill_predict_length=2048)
bench() {  # bench SECONDS OUTFILE ARGS... (0 seconds: skipped)
  local s=$1 out=$2; shift 2
  [ "$s" -gt 0 ] || return 0
  step "bench_maxtext $* ($(cap "$s") s)" | tee -a "$OUT/run.log"
  timeout "$(cap "$s")" python3 lab/bench/bench_maxtext.py --out "$OUT/$out" "$@" 2>&1 \
    | grep -v "^WARNING\|^W[0-9]\|^I[0-9]" | tail -n 40 | tee -a "$OUT/run.log"
  echo "rc=${PIPESTATUS[0]} (124: cut at the step's time box)" | tee -a "$OUT/run.log"
}
bench "${MT_SERVE_S:-280}" serve.json --cases serve --runs 5 --decode-steps 32 -- "${MODEL[@]}" "${COMMON[@]}" \
  base_num_decoder_layers="$SERVE_LAYERS"
bench "${MT_LAYER_S:-170}" layer.json --cases layer,step --runs 5 -- "${MODEL[@]}" "${COMMON[@]}" \
  base_num_decoder_layers="${MT_STEP_LAYERS:-4}"
# tokamax 0.0.17's mosaic ragged_dot is timed even where its output differs from moetune's (the record
# says so): the comparison with MaxText's default route has already checked moetune's.
bench "${MT_TOKAMAX_S:-110}" tokamax.json --cases layer,step --workloads train --runs 5 --time-mismatched \
  -- "${MODEL[@]}" "${COMMON[@]}" base_num_decoder_layers="${MT_STEP_LAYERS:-4}" use_tokamax_gmm=true
