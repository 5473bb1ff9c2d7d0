"""A config as tables show it: the fields that differ from the backend's default, in the Config's own
order, whichever order the dict came in (sorted JSON from --json, a row's column order)."""

from __future__ import annotations

from moetune.tuner import config_diff


def test_changed_fields_follow_the_config_declaration_not_the_dict_order():
    as_sorted_json = {"chunk_m": 16, "items_per_step": 4, "strategy": "chunked"}
    as_declared = {"strategy": "chunked", "chunk_m": 16, "items_per_step": 4}
    expected = "strategy=chunked,chunk_m=16,items_per_step=4"
    assert config_diff.text("xla", as_sorted_json) == config_diff.text("xla", as_declared) == expected


def test_only_differing_fields_and_unknown_fields_after_them():
    config = {"zeta": 1, "items_per_step": 8, "chunk_m": 32, "strategy": "ragged_dot"}
    assert config_diff.changed("xla", config) == {"chunk_m": 32, "zeta": 1}
    default = {"strategy": "ragged_dot", "chunk_m": 128, "items_per_step": 8}
    assert config_diff.text("xla", default) == "defaults"
    assert config_diff.text("xla", None) == ""


def test_a_backend_unknown_here_shows_the_whole_config_as_given():
    assert config_diff.changed("no-such-backend", {"b": 1, "a": 2}) == {"b": 1, "a": 2}


def test_a_config_of_an_ops_own_config_class_is_shown_against_that_class():
    # mosaic_gpu's decode block has a Config of its own beside the GEMMs' (Backend.op_configs).
    block = {"fused": True, "block_h": 128, "down_split": 8} | {"block_f": 32, "block_k": 128}
    assert config_diff.text("mosaic_gpu", block) == "block_h=128,down_split=8"
    assert config_diff.text("mosaic_gpu", {"fused": False}) == "fused=False"
    assert config_diff.text("mosaic_gpu", {"block_m": 64, "split_k": 2}).startswith("block_m=64")
