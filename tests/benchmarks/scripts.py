"""The benchmark scripts as modules for tests, loaded from their files under unique module names.

The scripts in benchmarks/ run as `python3 benchmarks/<name>.py`: Python then puts benchmarks/ first on
sys.path, and they import their siblings by bare name (`import moe_shapes`). A test loads a script the
same way, but as `moetune_benchmarks_<name>` and with benchmarks/ on sys.path only while it executes, and
drops the bare sibling names afterwards, so that no test process ever holds a top-level module called
`moe_shapes` or `benchmarks` that another package could collide with.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


def load_script(name: str) -> ModuleType:
    unique = f"moetune_benchmarks_{name}"
    if unique in sys.modules:
        return sys.modules[unique]
    spec = importlib.util.spec_from_file_location(unique, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    before = set(sys.modules)
    sys.modules[unique] = module
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[unique]
        raise
    finally:
        sys.path.remove(str(BENCHMARKS))
        for added in set(sys.modules) - before - {unique}:
            if Path(getattr(sys.modules[added], "__file__", None) or "/").parent == BENCHMARKS:
                del sys.modules[added]  # a sibling the script imported by its bare name
    return module
