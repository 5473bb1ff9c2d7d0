"""Which database: an explicit URL, else $MOETUNE_DB, else a SQLite file in the user's data directory.

Passwords never reach output, logs or error messages: everything printed goes through `masked()`, and
`scrub()` removes the password from driver messages that might echo connection parameters. Nor do they
reach a command line, which every user of the machine can read (ps, /proc) and which Ray records as a
job's entrypoint: `refuse_password()` turns such a --db away, and $MOETUNE_DB or a pgpass file carries it.
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


def has_password(text: str) -> bool:
    """Whether `text` is a URL that carries a password: in its user part (scheme://user:pw@host) or as
    libpq's `password` query parameter (scheme://user@host/db?password=pw).

    Read by the parser that connects (SQLAlchemy's make_url), never a second one: urlsplit ends the user
    part at the first `/`, `?` or `#`, so `postgresql://u:a/b@host/db` held no password for it while
    make_url connects with the password `a/b`."""
    try:
        url = parse(text)
    except DatabaseError:  # not a URL anything could connect with
        return False
    return url.password is not None or "password" in url.query


def refuse_password(url: str) -> None:
    """A database URL given on a command line must not carry a password."""
    if has_password(url):
        raise DatabaseError(
            "--db holds a password, which the process list shows every user and Ray records with the "
            f"sweep; put the URL in ${ENV_DB}, or the password in a pgpass file (~/.pgpass or $PGPASSFILE, "
            "which psycopg reads)"
        )


def sqlite_file(url: URL) -> Path | None:
    """The file of a SQLite URL; None for other databases and for in-memory SQLite."""
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    if url.database.startswith("file:"):  # URI form (sqlite:///file:path?uri=true)
        return Path(url.database[len("file:") :].split("?", 1)[0])
    return Path(url.database)
