"""The server's write token: $MOETUNE_SERVER_TOKEN, else a file only its owner can read (created with
a new token on first start). The token itself is never printed or logged; its file's path is."""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from moetune.kernels.errors import ConfigInvalid
from moetune.service.settings import ENV_TOKEN

TOKEN_FILE = "server-token"
MIN_LENGTH = 16


def default_path() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("moetune")) / TOKEN_FILE


def read_or_create(path: Path) -> str:
    """The token in `path`, creating the file (0600, 192 random bits) if it does not exist. A file that
    other users can read, or a token shorter than MIN_LENGTH, is refused."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            readable = f"token file {path} is readable by other users (mode {mode:o}); chmod 600 it"
            raise ConfigInvalid(readable) from None
        token = path.read_text().strip()
    else:
        token = secrets.token_urlsafe(24)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    if len(token) < MIN_LENGTH:
        raise ConfigInvalid(f"token file {path} holds fewer than {MIN_LENGTH} characters")
    return token


def resolve(path: Path | None) -> tuple[str, str]:
    """(token, where it came from): $MOETUNE_SERVER_TOKEN, else `path` or the default file."""
    given = os.environ.get(ENV_TOKEN)
    if given:
        if len(given) < MIN_LENGTH:
            raise ConfigInvalid(f"${ENV_TOKEN} holds fewer than {MIN_LENGTH} characters")
        return given, f"${ENV_TOKEN}"
    path = path or default_path()
    return read_or_create(path), str(path)
