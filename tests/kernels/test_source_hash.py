"""A backend's source hash covers its kernel code, not its timer."""

import sys

import pytest

from moetune.kernels import backend


@pytest.fixture
def package(tmp_path, monkeypatch):
    root = tmp_path / "fake_backend_pkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "kernel.py").write_text("TILE = 128\n")
    (root / "timer.py").write_text("RUNS = 10\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield root
    sys.modules.pop("fake_backend_pkg", None)
    backend._package_hash.cache_clear()


def digest():
    backend._package_hash.cache_clear()
    return backend._package_hash("fake_backend_pkg")


def test_timer_edits_keep_the_hash_and_kernel_edits_change_it(package):
    before = digest()
    (package / "timer.py").write_text("RUNS = 50\n")
    assert digest() == before
    (package / "kernel.py").write_text("TILE = 64\n")
    assert digest() != before
