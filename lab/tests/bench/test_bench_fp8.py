"""bench_fp8.py's paired variants of the block-scale heuristic: each differs from it in one field."""

import dataclasses

import pytest

from moetune_lab.bench.bench_fp8 import block_variants

pytest.importorskip("jax")
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig as C  # noqa: E402
from moetune.kernels.problem import Problem  # noqa: E402

FP8 = "float8_e4m3fn"


def _problem(layout):
    return Problem("grouped_matmul_fp8", 8192, 4096, 14336, 8, FP8, FP8, "bfloat16", True, layout)


def test_block_scales_pair_the_heuristic_with_one_block_steps_and_the_other_consumer_schedule():
    config = C(block_m=64, block_n=128, block_k=256, max_concurrent_steps=3, wg_split="n")
    variants = block_variants(_problem("block_1x128_128x128"), config)
    assert variants == {
        "one_block_steps": dataclasses.replace(config, block_k=128, max_concurrent_steps=6),
        "staggered": dataclasses.replace(config, stagger_consumers=True),
    }
    staggered = variants["staggered"]
    assert block_variants(_problem("block_1x128_128x128"), staggered)["lockstep"] == config


def test_one_consumer_and_per_channel_scales_have_no_consumer_schedule_to_pair():
    single = C(block_m=64, block_n=128, block_k=128, max_concurrent_steps=3, wg_split="none")
    assert block_variants(_problem("block_1x128_128x128"), single) == {}
    paired = C(block_m=64, block_n=128, block_k=256, max_concurrent_steps=3, wg_split="n")
    assert block_variants(_problem("row_channel"), paired) == {}
