"""Synthetic values shared by the benchmark-tool tests."""

# A mosaic_gpu config as bench_gemm.py records its winner: two 64x128 consumers split along N.
MOSAIC_CONFIG = {
    "block_m": 64,
    "block_n": 128,
    "block_k": 64,
    "max_concurrent_steps": 4,
    "warp_specialized": True,
    "wg_split": "n",
    "persistent": True,
    "split_k": 1,
    "grid_minor_dim": "m",
    "grid_tile_width": 8,
}
