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
