"""Data flows one way (DESIGN.md): the product's top-level packages import each other without a cycle, and
nothing in the product imports the lab next door. Every `import moetune.X` and `from moetune.X ... import`
in every product module is read with `ast`, at module level and inside functions alike: a lazy import still
ties two packages together. A backend is one folder that plugs in; inside the mosaic_gpu folder, the modules
that load at import time form no cycle either."""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAB_NAMES = ("moetune_lab", "lab", "benchmarks")


def product_roots() -> dict[str, Path]:
    """Top-level package name -> folder, as pyproject's package-dir maps them into `moetune`."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {name.split(".", 1)[1]: ROOT / folder for name, folder in mapping.items() if name.count(".") == 1}


def module_name(root: str, folder: Path, path: Path) -> str:
    parts = list(path.relative_to(folder).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["moetune", root, *parts])


def imported_modules(path: Path, name: str, *, module_level_only: bool = False) -> Iterator[str]:
    """Absolute names of what `path` imports: `from . import x` resolved against `name`; with
    `module_level_only`, imports inside functions are left out (they run on first use, not at import)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nodes = tree.body if module_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield target
            # `from moetune.kernels.backends.mosaic_gpu import tiling` imports the module tiling.
            yield from (f"{target}.{alias.name}" for alias in node.names)


def product_files() -> Iterator[tuple[str, Path, str]]:
    for root, folder in product_roots().items():
        for path in sorted(folder.rglob("*.py")):
            yield root, path, module_name(root, folder, path)


def package_graph() -> dict[str, dict[str, str]]:
    """package -> {imported package: 'module imports module'} (one example per edge)."""
    roots = product_roots()
    graph: dict[str, dict[str, str]] = {root: {} for root in roots}
    for root, path, name in product_files():
        for target in imported_modules(path, name):
            parts = target.split(".")
            if len(parts) >= 2 and parts[0] == "moetune" and parts[1] in roots and parts[1] != root:
                graph[root].setdefault(parts[1], f"{name} imports {target}")
    return graph


def find_cycle(graph: dict[str, dict[str, str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def describe(graph: dict[str, dict[str, str]], cycle: list[str]) -> str:
    return "; ".join(f"{a} -> {b} ({graph[a][b]})" for a, b in zip(cycle, cycle[1:], strict=False))


def test_find_cycle_finds_a_loop_and_passes_a_chain():
    assert find_cycle({"a": {"b": ""}, "b": {"c": ""}, "c": {}}) is None
    assert find_cycle({"a": {"b": ""}, "b": {"c": ""}, "c": {"a": ""}}) == ["a", "b", "c", "a"]


def test_relative_imports_resolve_against_the_package(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "mod.py").write_text("from .plan import KernelPlan\nfrom . import tiling\n")
    found = set(imported_modules(pkg / "mod.py", "moetune.kernels.pkg.mod"))
    assert {"moetune.kernels.pkg.plan", "moetune.kernels.pkg.tiling"} <= found


def test_the_product_packages_import_each_other_without_a_cycle():
    graph = package_graph()
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle between product packages: {describe(graph, cycle)}"


def test_the_kernels_import_no_tuner_db_or_service():
    """The bottom layer: what runs under JAX's trace imports nothing that drives sweeps or stores trials."""
    assert set(package_graph()["kernels"]) <= {"configs"}, package_graph()["kernels"]


def test_nothing_in_the_product_imports_the_command_line():
    """The top layer: the command line drives the tuner, the database and the service; none imports it."""
    graph = package_graph()
    assert not {root: graph[root]["cli"] for root in graph if "cli" in graph[root]}


def test_nothing_in_the_product_imports_the_lab():
    found = []
    for _root, path, name in product_files():
        for target in imported_modules(path, name):
            if target.split(".")[0] in LAB_NAMES or target.startswith(
                tuple(f"moetune.{n}" for n in LAB_NAMES)
            ):
                found.append(f"{path.relative_to(ROOT)}: {target}")
    assert not found, found


@pytest.mark.parametrize("backend", ["mosaic_gpu", "xla", "flydsl"])
def test_a_backend_folder_has_no_module_level_cycle(backend):
    folder = product_roots()["kernels"] / "backends" / backend
    prefix = f"moetune.kernels.backends.{backend}"
    names = {module_name("kernels", product_roots()["kernels"], p): p for p in folder.glob("*.py")}
    graph: dict[str, dict[str, str]] = {name: {} for name in names}
    for name, path in names.items():
        for target in imported_modules(path, name, module_level_only=True):
            # Every module loads its package's __init__ first, which is fine while that stays light.
            if target in names and target not in (name, prefix):
                graph[name].setdefault(target, f"{name} imports {target}")
    cycle = find_cycle(graph)
    assert cycle is None, f"module-level import cycle in {backend}: {describe(graph, cycle)}"
