"""The password of a PostgreSQL test URL that carries none: libpq reads it from a pgpass file (CI writes
one, as moetune asks users to), and a test that needs the URL with its password, to prove it is masked
or kept out of Ray, takes it from the same file."""

from __future__ import annotations

import os
from pathlib import Path


def pgpass_password(url) -> str | None:
    """The password libpq would take for `url` (a SQLAlchemy URL) from $PGPASSFILE or ~/.pgpass:
    host:port:db:user:password lines, `*` matching anything (escaped colons are not used here)."""
    path = Path(os.environ.get("PGPASSFILE") or Path.home() / ".pgpass")
    if not path.is_file():
        return None
    wanted = (url.host or "localhost", str(url.port or 5432), url.database or "", url.username or "")
    for line in path.read_text().splitlines():
        fields = line.split(":")
        if len(fields) == 5 and all(f in ("*", w) for f, w in zip(fields[:4], wanted, strict=True)):
            return fields[4]
    return None
