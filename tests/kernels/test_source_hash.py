"""A backend's source hash covers its kernel code, not its timer, and the shared kernel modules it names
outside its folder."""

import ast
import importlib.resources
import sys

import pytest

from moetune.kernels import backend, registry
from moetune.kernels.backends.xla.backend import XlaBackend

BUILTIN = ("flydsl", "mosaic_gpu", "xla")


@pytest.fixture(autouse=True)
def fresh_hashes():
    backend._package_hash.cache_clear()
    backend._source_hash.cache_clear()
    yield
    backend._package_hash.cache_clear()
    backend._source_hash.cache_clear()


@pytest.fixture
def package(tmp_path, monkeypatch):
    root = tmp_path / "fake_backend_pkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "kernel.py").write_text("TILE = 128\n")
    (root / "timer.py").write_text("RUNS = 10\n")
    shared = tmp_path / "fake_shared_pkg"
    shared.mkdir()
    (shared / "__init__.py").write_text("")
    (shared / "block.py").write_text("ROWS = 16\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield root
    for name in ("fake_backend_pkg", "fake_shared_pkg"):
        sys.modules.pop(name, None)


def digest():
    backend._package_hash.cache_clear()
    return backend._package_hash("fake_backend_pkg")


def test_timer_edits_keep_the_hash_and_kernel_edits_change_it(package):
    before = digest()
    (package / "timer.py").write_text("RUNS = 50\n")
    assert digest() == before
    (package / "kernel.py").write_text("TILE = 64\n")
    assert digest() != before


class _Fake(XlaBackend):
    """A concrete backend living in the fake package, naming a module outside it."""

    __module__ = "fake_backend_pkg.backend"
    shared_kernel_modules = ("fake_shared_pkg.block",)


def shared_digest():
    backend._package_hash.cache_clear()
    backend._source_hash.cache_clear()
    return _Fake().source_hash()


def test_edits_of_a_shared_kernel_module_change_the_hash(package):
    before = shared_digest()
    assert len(before) == 16 and before != digest()
    (package.parent / "fake_shared_pkg" / "block.py").write_text("ROWS = 32\n")
    edited = shared_digest()
    assert edited != before
    (package / "kernel.py").write_text("TILE = 64\n")  # the folder still counts, its timer still does not
    after = shared_digest()
    assert after != edited
    (package / "timer.py").write_text("RUNS = 50\n")
    assert shared_digest() == after


def test_a_backend_without_shared_modules_hashes_its_folder_alone(package):
    assert backend._source_hash("fake_backend_pkg", ()) == digest()


def test_a_missing_shared_module_is_an_error_not_a_silent_hash(package):
    with pytest.raises(FileNotFoundError):
        backend._source_hash("fake_backend_pkg", ("fake_shared_pkg.no_such_module",))


def test_editing_the_decode_block_kernel_makes_mosaic_gpus_winners_stale(monkeypatch):
    mosaic = registry.get("mosaic_gpu")
    before = mosaic.source_hash()
    read = backend._module_source
    for edited in ("moetune.kernels.moe.decode_block", "moetune.kernels.moe.routing_kernel"):
        backend._source_hash.cache_clear()
        monkeypatch.setattr(
            backend, "_module_source", lambda name, e=edited: read(name) + (b"#\n" if name == e else b"")
        )
        assert mosaic.source_hash() != before, edited


def _imported_moe_modules(package: str) -> set[str]:
    """The moetune.kernels.moe modules that the backend folder's files import, at any depth of the code."""
    found = set()
    for entry in importlib.resources.files(package).iterdir():
        if not entry.name.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(entry.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "moetune.kernels.moe":
                found |= {f"{node.module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("moetune.kernels.moe."):
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("moetune.kernels.moe.")}
    moe = importlib.resources.files("moetune.kernels.moe")  # a name imported from the package is no module
    return {name for name in found if moe.joinpath(f"{name.rpartition('.')[2]}.py").is_file()}


@pytest.mark.parametrize("name", BUILTIN)
def test_every_kernel_a_backend_imports_from_kernels_moe_is_hashed(name):
    # A module holding a Pallas kernel is part of what the backend's configs compute; helpers are not.
    served = registry.get(name)
    package = type(served).__module__.rpartition(".")[0]
    kernels = {
        module
        for module in _imported_moe_modules(package)
        if "pallas_call" in backend._module_source(module).decode()
    }
    assert kernels <= set(served.shared_kernel_modules), kernels
    for module in served.shared_kernel_modules:
        assert not module.startswith(package + "."), f"{module} is in the folder, hashed already"
        assert backend._module_source(module)


def test_the_decode_block_is_a_shared_kernel_module_of_mosaic_gpu():
    assert "moetune.kernels.moe.decode_block" in registry.get("mosaic_gpu").shared_kernel_modules
