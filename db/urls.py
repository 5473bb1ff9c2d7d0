"""Which database: an explicit URL, else $MOETUNE_DB, else a SQLite file in the user's data directory.

Passwords never reach output, logs or error messages: everything printed goes through `masked()`, and
`scrub()` removes the password from driver messages that might echo connection parameters.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from moetune.db.errors import DatabaseError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

ENV_DB = "MOETUNE_DB"
DEFAULT_FILE = "moetune.db"


def default_path() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("moetune")) / DEFAULT_FILE


def default_url() -> str:
    return f"sqlite:///{default_path()}"


def resolve(url: str | None) -> str:
    """url > $MOETUNE_DB > the default SQLite file."""
    return url or os.environ.get(ENV_DB) or default_url()


def parse(url: str) -> URL:
    """The SQLAlchemy URL; the error never repeats the text, which may hold a password."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url)
    except (ArgumentError, ValueError) as e:
        raise DatabaseError(
            "not a database URL (expected e.g. sqlite:///path/to/file.db or "
            "postgresql+psycopg://user:password@host:5432/name)"
        ) from e


def masked(url: str | URL) -> str:
    """The URL with its password replaced by ***; an unparsable URL is not shown at all."""
    try:
        parsed = parse(url) if isinstance(url, str) else url
    except DatabaseError:
        return "<unparsable database URL>"
    return parsed.render_as_string(hide_password=True)


def scrub(message: str, url: URL) -> str:
    """One line, without the password even where a driver quotes it."""
    line = re.sub(r"\s+", " ", message).strip()
    if url.password:
        line = line.replace(str(url.password), "***")
    return line


def sqlite_file(url: URL) -> Path | None:
    """The file of a SQLite URL; None for other databases and for in-memory SQLite."""
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    if url.database.startswith("file:"):  # URI form (sqlite:///file:path?uri=true)
        return Path(url.database[len("file:") :].split("?", 1)[0])
    return Path(url.database)
