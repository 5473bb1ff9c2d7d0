"""Every training test starts from an empty winner lookup, with no backend forced by the environment."""

from __future__ import annotations

import pytest

from moetune.kernels.lookup import LOOKUP


@pytest.fixture(autouse=True)
def isolated_lookup(monkeypatch):
    monkeypatch.delenv("MOETUNE_BACKEND", raising=False)
    LOOKUP.clear()
    yield
    LOOKUP.clear()
