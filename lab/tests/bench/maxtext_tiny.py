"""The tiny MaxText MoE model of the plug-in's tests, as bench_maxtext.py's CPU test runs it."""

from __future__ import annotations

import os

# Two layers of 8 experts (top-2) over a 64-wide model: small enough to compile in seconds on a CPU. Dims
# are MaxText's base_* fields; a fully MoE model needs base_mlp_dim == base_moe_mlp_dim.
TINY = dict(
    run_name="moetune-tiny",
    enable_checkpointing=False,
    skip_jax_distributed_system=True,
    decoder_block="mixtral",
    num_experts=8,
    num_experts_per_tok=2,
    base_emb_dim=64,
    base_mlp_dim=96,
    base_moe_mlp_dim=96,
    base_num_query_heads=4,
    base_num_kv_heads=4,
    head_dim=16,
    base_num_decoder_layers=2,
    vocab_size=256,
    max_target_length=32,
    max_prefill_predict_length=16,
    per_device_batch_size=2,
    dtype="float32",
    weight_dtype="float32",
    attention="dot_product",
)


def base_yml() -> str:
    import maxtext

    return os.path.join(os.path.dirname(maxtext.__file__), "configs", "base.yml")
