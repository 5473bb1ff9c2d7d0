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


def _read(path: Path) -> str | None:
    """The token in `path`; None if there is no such file. A file that other users can read, anything but
    a regular file, or a token shorter than MIN_LENGTH is refused."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ConfigInvalid(f"token file {path}: {e.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigInvalid(f"token file {path} is not a regular file")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise ConfigInvalid(f"token file {path} is readable by other users (mode {mode:o}); chmod 600 it")
    try:
        token = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigInvalid(
            f"token file {path} cannot be read: {getattr(e, 'strerror', None) or e}"
        ) from None
    if len(token) < MIN_LENGTH:
        raise ConfigInvalid(f"token file {path} holds fewer than {MIN_LENGTH} characters")
    return token


def _create(path: Path) -> str:
    """A new token (192 random bits) in a new 0600 file."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        raise ConfigInvalid(f"cannot create token file {path}: {e.strerror}") from None
    token = secrets.token_urlsafe(24)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def resolve(path: Path | None, *, create: bool = True) -> tuple[str | None, str]:
    """(token, where it came from): $MOETUNE_SERVER_TOKEN, else `path` or the default file, created if
    missing and `create` (else None: checked, nothing written yet)."""
    given = os.environ.get(ENV_TOKEN)
    if given:
        if len(given) < MIN_LENGTH:
            raise ConfigInvalid(f"${ENV_TOKEN} holds fewer than {MIN_LENGTH} characters")
        return given, f"${ENV_TOKEN}"
    path = path or default_path()
    token = _read(path)
    if token is None and create:
        token = _create(path)
    return token, str(path)
