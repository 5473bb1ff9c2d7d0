"""Every config pack shipped in configs/tuned/ loads, names a registered backend, and holds valid configs."""

import importlib.resources

import pytest

from moetune.kernels import packs, registry

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
        backend.config_cls.from_dict(item.config)  # raises ConfigInvalid if the backend no longer accepts it
        assert item.median_s is not None and item.median_s > 0
