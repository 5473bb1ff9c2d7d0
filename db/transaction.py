"""The one way the store talks to the database: a function run inside one transaction.

Every database failure is rolled back and re-raised as DatabaseError with a one-line message that names
the (masked) URL. Transient conflicts are retried with the whole transaction: SQLite's busy/locked
(left after busy_timeout, e.g. a WAL checkpoint racing a writer), PostgreSQL's serialization
failures and deadlocks, and a lost race for the one active winner. Conflicts are recognised by error
code and constraint name, never by message text.

A lost connection (the server restarting, a network blip) is retried too, but only by a caller that
asks for it with `reconnect_s` (the sweep driver and its heartbeat, within the lease's grace): a command
meeting a database that is not there should say so at once. A commit whose connection was lost may have
landed: `fn` is told so through `session.info[MAY_HAVE_COMMITTED]` and finds its own row instead of
writing it twice.
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
# A connection that went away, by SQLSTATE: class 08 (connection exception) and the server going down or
# not up yet (57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now). libpq gives no
# SQLSTATE at all when it cannot reach the server (connection refused): an OperationalError without one.
_POSTGRES_GONE = {"57P01", "57P02", "57P03"}
# Pauses between attempts to reach a database that went away: backing off to 2 s, until `reconnect_s`.
RECONNECT_DELAYS_S = (0.1, 0.2, 0.5, 1.0, 2.0)
MAY_HAVE_COMMITTED = "moetune_may_have_committed"


def run[T](
    engine: Engine,
    url: URL,
    fn: Callable[[Session], T],
    *,
    write: bool,
    on_commit: Callable[[Session], None] | None = None,
    reconnect_s: float = 0.0,
) -> T:
    """fn(session) inside one transaction, committed when it returns; retried on transient conflicts,
    and for up to `reconnect_s` seconds on a lost connection.

    on_commit(session) runs after a successful commit (the session's info is still there).
    """
    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.orm import Session

    bind = writer(engine) if write else engine
    conflicts = iter(RETRY_DELAYS_S)
    deadline = time.monotonic() + reconnect_s
    gone = 0  # attempts that found the connection lost
    for _ in range(len(RETRY_DELAYS_S) + 1 + _most_reconnects(reconnect_s)):
        session = Session(bind, expire_on_commit=False)
        session.info[MAY_HAVE_COMMITTED] = gone > 0 and write
        try:
            with session.begin():
                result = fn(session)
            if on_commit is not None:
                on_commit(session)
            return result
        except SQLAlchemyError as e:
            lost = is_disconnect(e)
            if lost:
                delay = RECONNECT_DELAYS_S[min(gone, len(RECONNECT_DELAYS_S) - 1)]
                gone += 1
                if time.monotonic() + delay <= deadline:
                    engine.dispose(close=False)  # the pool's other connections went with the server
                    time.sleep(delay)
                    continue
            if (is_transient(e) or (lost and e.connection_invalidated)) and (
                delay := next(conflicts, None)
            ) is not None:  # a pooled connection found dead: worth a quick retry for anyone
                time.sleep(delay)
                continue
            raise DatabaseError(describe(e, url)) from e
        finally:
            session.close()
    raise DatabaseError(f"database {urls.masked(url)}: still unreachable after {reconnect_s:.0f} s")


def _most_reconnects(reconnect_s: float) -> int:
    """An upper bound on the attempts `reconnect_s` allows (the deadline ends them first)."""
    return int(reconnect_s / RECONNECT_DELAYS_S[0]) + 1 if reconnect_s > 0 else 0


def is_disconnect(error: BaseException) -> bool:
    """Whether `error` is the connection going away (or not coming up), not anything the statement did."""
    from sqlalchemy.exc import DBAPIError, OperationalError

    if not isinstance(error, DBAPIError):
        return False
    if error.connection_invalidated:
        return True
    orig = error.orig
    if getattr(orig, "sqlite_errorcode", None) is not None or not hasattr(orig, "sqlstate"):
        return False  # SQLite has no connection to lose; only psycopg's errors carry `sqlstate`
    sqlstate = orig.sqlstate
    if sqlstate is None:  # libpq could not talk to the server at all
        return isinstance(error, OperationalError)
    return sqlstate.startswith("08") or sqlstate in _POSTGRES_GONE


def is_transient(error: BaseException) -> bool:
    from sqlalchemy.exc import DBAPIError

    if not isinstance(error, DBAPIError):
        return False
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
