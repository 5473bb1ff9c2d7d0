"""The server's write token: from $MOETUNE_SERVER_TOKEN, else a 0600 file created on first start; a file
others can read, a short token or a non-file is refused; checking writes nothing."""

from __future__ import annotations

import stat

import pytest

from moetune.kernels.errors import ConfigInvalid
from moetune.service import token_file
from moetune.service.settings import ENV_TOKEN


@pytest.fixture(autouse=True)
def no_env_token(monkeypatch):
    monkeypatch.delenv(ENV_TOKEN, raising=False)


def test_a_missing_file_is_created_private_and_read_back(tmp_path):
    path = tmp_path / "deep" / "token"
    assert token_file.resolve(path, create=False) == (None, str(path)) and not path.exists()
    token, source = token_file.resolve(path)
    assert source == str(path) and len(token) >= token_file.MIN_LENGTH
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert token_file.resolve(path) == (token, str(path))


def test_the_environment_wins_over_any_file(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_TOKEN, "e" * 20)
    assert token_file.resolve(tmp_path / "token") == ("e" * 20, f"${ENV_TOKEN}")
    assert not (tmp_path / "token").exists()
    monkeypatch.setenv(ENV_TOKEN, "short")
    with pytest.raises(ConfigInvalid, match="fewer than 16"):
        token_file.resolve(None)


@pytest.mark.parametrize(
    ("content", "mode", "message"),
    [("x" * 32, 0o644, "readable by other users"), ("short", 0o600, "fewer than 16")],
)
def test_a_bad_file_is_refused(tmp_path, content, mode, message):
    path = tmp_path / "token"
    path.write_text(content)
    path.chmod(mode)
    with pytest.raises(ConfigInvalid, match=message):
        token_file.resolve(path)


def test_a_directory_is_not_a_token_file(tmp_path):
    with pytest.raises(ConfigInvalid, match="not a regular file"):
        token_file.resolve(tmp_path)
