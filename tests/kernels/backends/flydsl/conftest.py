"""Fixtures for the FlyDSL backend tests: the real toolchain (or a clear skip) and private caches."""

from __future__ import annotations

import os

import pytest

from moetune.kernels.backends.flydsl import toolchain


@pytest.fixture
def flydsl_cache(tmp_path, monkeypatch):
    """A private code-object cache; forgets the toolchain found under another cache."""
    monkeypatch.setenv(toolchain.ENV_CACHE, str(tmp_path / "flydsl-cache"))
    forget = toolchain.toolchain.cache_clear  # kept: a test may replace toolchain() itself
    forget()
    yield tmp_path / "flydsl-cache"
    forget()


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("flydsl-cache")


@pytest.fixture(scope="session")
def real_toolchain(session_cache):
    """The FlyDSL toolchain, found once per session (probing the interpreter takes seconds).

    Skips without it locally; fails under CI=true, where scripts/setup-flydsl.sh provides it.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(toolchain.ENV_CACHE, str(session_cache))
        toolchain.toolchain.cache_clear()
        try:
            found = toolchain.toolchain()
        except toolchain.ToolchainMissing as e:
            if os.environ.get("CI") == "true":
                pytest.fail(
                    f"FlyDSL toolchain missing in CI ({e}); .ci/run must call scripts/setup-flydsl.sh"
                )
            pytest.skip(f"FlyDSL toolchain not installed here: {e}")
        yield found
        toolchain.toolchain.cache_clear()


@pytest.fixture
def toolchain_in_use(real_toolchain, session_cache, monkeypatch):
    """real_toolchain, also returned by toolchain.toolchain() during the test (whatever ran before)."""
    monkeypatch.setattr(toolchain, "toolchain", lambda: real_toolchain)
    monkeypatch.setenv(toolchain.ENV_CACHE, str(session_cache))
    return real_toolchain
