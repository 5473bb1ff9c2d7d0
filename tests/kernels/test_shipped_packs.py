"""Every config pack shipped in configs/tuned/ loads, names a registered backend, and holds valid configs;
on its own device, dispatch resolves its entries as fresh exact winners."""

import dataclasses
import importlib.resources
import sys

import pytest

from moetune.kernels import lookup, packs, registry
from moetune.kernels.api import explain
from moetune.kernels.backends.xla import XlaConfig
from moetune.kernels.space import SearchSpace

SHIPPED = sorted(
    entry
    for entry in importlib.resources.files("moetune.configs").joinpath("tuned").iterdir()
    if entry.name.endswith(".json")
)


def test_at_least_one_pack_ships():
    assert SHIPPED, "configs/tuned/ holds no pack"


@pytest.mark.parametrize("entry", SHIPPED, ids=lambda e: e.name)
def test_pack_is_valid_and_named_for_its_device(entry):
    pack = packs.load(entry)
    assert entry.name == packs.file_name(pack.device.device_kind, pack.backend)
    backend = registry.get(pack.backend)
    assert pack.entries
    for item in pack.entries:
        backend.config_class(item.problem.op).from_dict(
            item.config
        )  # raises ConfigInvalid if the backend no longer accepts it
        assert item.median_s is not None and item.median_s > 0


def _as_running_device(monkeypatch, backend, device):
    """Make `device` the running one for `backend`: explain takes it as an argument, and the backend's
    build reads the running device itself (the validity rules it checks depend on it)."""
    module = sys.modules[type(backend).__module__]
    if hasattr(module, "current_fingerprint"):
        monkeypatch.setattr(module, "current_fingerprint", lambda: device)


@pytest.mark.parametrize("entry", SHIPPED, ids=lambda e: e.name)
def test_pack_entries_resolve_exact_and_fresh_on_the_packs_device(entry, monkeypatch):
    pack = packs.load(entry)
    backend = registry.get(pack.backend)
    _as_running_device(monkeypatch, backend, pack.device)
    for item in pack.entries:
        explanation = explain(item.problem, device=pack.device)
        assert (explanation.backend, explanation.source) == (pack.backend, "pack exact"), str(explanation)
        # As values: a field added later takes its default where the pack's entry predates it.
        assert explanation.config == backend.config_class(item.problem.op).from_dict(item.config)
        assert explanation.median_s == item.median_s
        # Stale here means the kernel source changed since the pack was tuned: re-tune and re-export it.
        assert explanation.stale == (), f"{entry.name} is stale: {'; '.join(explanation.stale)}"


@pytest.mark.parametrize("entry", SHIPPED, ids=lambda e: e.name)
def test_pack_on_another_driver_is_used_but_flagged_stale(entry, monkeypatch):
    pack = packs.load(entry)
    other = dataclasses.replace(pack.device, driver="0.0.0")
    backend = registry.get(pack.backend)
    _as_running_device(monkeypatch, backend, other)
    for item in pack.entries:
        explanation = explain(item.problem, device=other)
        assert explanation.source == "pack exact", str(explanation)
        assert explanation.config == backend.config_class(item.problem.op).from_dict(item.config)
        assert f"tuned on device fingerprint {pack.device.hash}, running {other.hash}" in explanation.stale


@pytest.mark.parametrize("entry", SHIPPED, ids=lambda e: e.name)
def test_trusting_a_packs_entries_asks_the_spaces_validity_and_never_their_seeds(entry, monkeypatch):
    """A process's first tuned call checks every entry of the pack it loads against the backend's search
    space for that problem (lookup.trusted_pack_entries, as `moetune import` does). Only the validity
    constraints are needed there: a space's seeds rank the whole space with the cost model, seconds for one
    problem on a large space, so reading them for each entry would make the first call wait."""

    def seeds(space):
        raise AssertionError(f"the seeds of a {space.config_cls.__name__} space were computed")

    monkeypatch.setattr(SearchSpace, "seeds", property(seeds))
    pack = packs.load(entry)
    trusted, rejected = lookup.trusted_pack_entries(pack)
    assert rejected == [] and len(trusted) == len(pack.entries)


def test_a_spaces_seeds_are_computed_when_first_read_and_once():
    calls = []

    def seeding():
        calls.append(1)
        return [XlaConfig()]

    space = SearchSpace(XlaConfig, {"chunk_m": (128, 256)}, seeding=seeding)
    assert calls == [] and space.restricted({"chunk_m": 128}).domains["chunk_m"] == (128,)
    assert space.seeds == (XlaConfig(),) and space.seeds == (XlaConfig(),) and calls == [1]
