"""MosaicGpuConfig: JSON round trip, config-only rules, derived CTA shape."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from moetune.kernels.backends.mosaic_gpu import space
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig
from moetune.kernels.errors import ConfigInvalid


def _valid_points(limit: int = 400):
    """Configs built from the search-space domains, skipping the ones a config rule rejects."""
    names = list(space.DOMAINS)
    out = []
    for values in itertools.product(*(space.DOMAINS[n] for n in names)):
        try:
            out.append(MosaicGpuConfig(**dict(zip(names, values, strict=True))))
        except ConfigInvalid:
            continue
        if len(out) >= limit:
            break
    return out


def test_json_round_trip_over_domain_points():
    configs = _valid_points()
    assert len(configs) == 400
    for config in configs:
        assert MosaicGpuConfig.from_json(config.to_json()) == config
        assert MosaicGpuConfig.from_dict(config.to_dict()) == config


def test_configs_are_frozen_and_hashable():
    config = MosaicGpuConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.block_m = 64  # type: ignore[misc]
    assert {config: 1}[MosaicGpuConfig()] == 1


def test_unknown_field_is_rejected():
    with pytest.raises(ConfigInvalid, match="unknown MosaicGpuConfig fields: tile_q"):
        MosaicGpuConfig.from_dict({**MosaicGpuConfig().to_dict(), "tile_q": 3})


@pytest.mark.parametrize(
    "change, message",
    [
        ({"block_m": 96}, "block_m=96"),
        ({"block_n": 96}, "block_n=96"),
        ({"block_n": 512}, "block_n=512"),
        ({"block_k": 48}, "block_k=48"),
        ({"max_concurrent_steps": 1}, "max_concurrent_steps=1"),
        ({"grid_minor_dim": "k"}, "grid_minor_dim='k'"),
        ({"grid_tile_width": 0}, "grid_tile_width=0"),
        ({"wg_split": "k"}, "wg_split='k'"),
        ({"warp_specialized": False, "wg_split": "n"}, "needs warp_specialized=True"),
        ({"epi_tile_n": 48}, "epi_tile_n=48"),
        ({"block_n": 64, "epi_tile_n": 128}, "epi_tile_n=128"),
        ({"epi_tile_m": 32}, "epi_tile_m=32"),
        ({"block_m": 64, "epi_tile_m": 128}, "epi_tile_m=128"),
        ({"split_k": 0}, "split_k=0"),
        ({"block_m": True}, "block_m=True"),
        ({"persistent": 1}, "persistent=1"),
        ({"tile_schedule": "scan"}, "tile_schedule='scan'"),
        ({"stagger_consumers": 1}, "stagger_consumers=1"),
        ({"wg_split": "none", "stagger_consumers": True}, "stagger_consumers needs two consumer"),
        ({"block_m": 12}, "block_m=12 is not a multiple of 8 below 64"),
        ({"block_m": 16, "wg_split": "m"}, "cannot split the token rows under swap_ab"),
        ({"block_m": 16, "split_k": 2}, "swap_ab stores 16-bit tiles only"),
        ({"block_m": 16, "epi_tile_n": 32}, "epi_tile_n=32 must be 64 under swap_ab"),
        ({"block_m": 16, "epi_tile_n": 128}, "epi_tile_n=128 must be 64 under swap_ab"),
        ({"block_m": 16, "epi_tile_m": 128}, "under swap_ab every row leaves at once"),
    ],
)
def test_each_config_rule(change, message):
    with pytest.raises(ConfigInvalid, match=message.replace("(", r"\(").replace("[", r"\[")):
        MosaicGpuConfig(**{**MosaicGpuConfig().to_dict(), **change})


@pytest.mark.parametrize(
    "split, cta, consumers",
    [("none", (128, 128), 1), ("m", (256, 128), 2), ("n", (128, 256), 2)],
)
def test_cta_tile_follows_the_warpgroup_split(split, cta, consumers):
    config = MosaicGpuConfig(block_m=128, block_n=128, wg_split=split)
    assert (config.cta_m, config.cta_n) == cta
    assert config.consumers == consumers


def test_str_is_key_value_pairs():
    text = str(MosaicGpuConfig())
    assert text.startswith("block_m=128,block_n=128,block_k=64,")
    assert "wg_split=n" in text


def test_a_block_m_below_64_swaps_the_operands():
    assert MosaicGpuConfig(block_m=8, wg_split="n").swap_ab
    assert not MosaicGpuConfig(block_m=64).swap_ab
    swapped = MosaicGpuConfig(block_m=32, block_n=128, wg_split="n", tile_schedule="table")
    assert (swapped.cta_m, swapped.cta_n) == (32, 256)
    assert MosaicGpuConfig.from_json(swapped.to_json()) == swapped
    # The defaults keep every config tuned before these fields existed as it was.
    assert MosaicGpuConfig().tile_schedule == "walk"
