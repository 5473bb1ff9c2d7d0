"""What a test needs from this machine: missing, it skips locally and fails under CI=true.

CI (.ci/run) installs every extra the tests use (dev, postgres, maxtext), starts PostgreSQL, installs
Chromium and the FlyDSL toolchain, so there a missing dependency is a broken setup, not a reason to skip;
on a developer's machine the test skips with the reason. The PostgreSQL fixture (tests/conftest.py), the
browser (tests/browser.py) and the FlyDSL toolchain fixture follow the same rule. GPU tests (tests/gpu,
marked gpu) are not covered: they skip cleanly without a GPU everywhere.

    jax = require("jax")                        # module level: the whole file skips (or fails in CI)
    require("maxtext", extra="maxtext")
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI") == "true"


def skip_or_fail(reason: str, fix: str) -> NoReturn:
    """Skip with `reason` locally; under CI=true fail, naming what CI should have done (`fix`)."""
    if in_ci():
        pytest.fail(f"{reason} under CI=true; {fix}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require(module: str, *, extra: str = "dev") -> ModuleType:
    """`module`, imported; or skip (locally) or fail (CI=true) when it cannot be imported."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        error = e
    skip_or_fail(
        f"{module} cannot be imported ({error})",
        f"scripts/setup-venv.sh installs it with moetune's {extra} extra",
    )
