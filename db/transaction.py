"""The one way the store talks to the database: a function run inside one transaction.

Every database failure is rolled back and re-raised as DatabaseError with a one-line message that names
the (masked) URL. Transient conflicts are retried with the whole transaction: SQLite's busy/locked
(left after busy_timeout, e.g. a WAL checkpoint racing a writer), PostgreSQL's serialization
failures and deadlocks, and a lost race for the one active winner. Conflicts are recognised by error
code and constraint name, never by message text.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from moetune.db import urls
from moetune.db.engine import writer
from moetune.db.errors import DatabaseError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL, Engine
    from sqlalchemy.orm import Session

# Pauses before each retry; empirical, long enough for another writer's transaction to finish.
RETRY_DELAYS_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
_SQLITE_CONFLICTS = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}
_POSTGRES_CONFLICTS = {"40001", "40P01"}  # serialization_failure, deadlock_detected
# Unique indexes whose violation means "another writer committed first; run again": two promotions of
# one key at once on PostgreSQL (SQLite's BEGIN IMMEDIATE serialises them). Run again, the second
# promotion supersedes the winner the first one just committed.
_RETRY_ON_UNIQUE = {"uq_winners_active"}
_UNIQUE_VIOLATION = "23505"


def run[T](
    engine: Engine,
    url: URL,
    fn: Callable[[Session], T],
    *,
    write: bool,
    on_commit: Callable[[Session], None] | None = None,
) -> T:
    """fn(session) inside one transaction, committed when it returns; retried on transient conflicts.

    on_commit(session) runs after a successful commit (the session's info is still there).
    """
    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.orm import Session

    bind = writer(engine) if write else engine
    for delay in (*RETRY_DELAYS_S, None):
        session = Session(bind, expire_on_commit=False)
        try:
            with session.begin():
                result = fn(session)
            if on_commit is not None:
                on_commit(session)
            return result
        except SQLAlchemyError as e:
            if delay is not None and is_transient(e):
                time.sleep(delay)
                continue
            raise DatabaseError(describe(e, url)) from e
        finally:
            session.close()
    raise AssertionError("unreachable: the last attempt returns or raises")


def is_transient(error: BaseException) -> bool:
    from sqlalchemy.exc import DBAPIError

    if not isinstance(error, DBAPIError):
        return False
    if error.connection_invalidated:
        return True
    orig = error.orig
    code = getattr(orig, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in _SQLITE_CONFLICTS  # extended codes keep the primary code in the low byte
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate == _UNIQUE_VIOLATION:
        return getattr(getattr(orig, "diag", None), "constraint_name", None) in _RETRY_ON_UNIQUE
    return sqlstate in _POSTGRES_CONFLICTS


def describe(error: BaseException, url: URL) -> str:
    """'database <masked url>: <driver message>' on one line, without SQL text or the password."""
    from sqlalchemy.exc import DBAPIError

    detail = error.orig if isinstance(error, DBAPIError) and error.orig is not None else error
    text = str(detail) or type(detail).__name__
    return f"database {urls.masked(url)}: {urls.scrub(text, url)}"
