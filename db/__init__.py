"""moetune.db: every trial, the winners with their history and the dispatch misses, in any SQL database.

    from moetune.db import open_store
    with open_store() as store:          # url > $MOETUNE_DB > SQLite in the user data directory
        store.record_trial(record)

Modules: store (the Store API), records (values in and out), models (ORM tables), migrations/ (Alembic),
schema (revisions), engine and transaction (connections, locking, retries, errors), urls (which
database, password masking), leases (which process runs a sweep), and one module per kind of query
(entities, trials, winners, misses, pack_io).
"""

from typing import TYPE_CHECKING

from moetune.db.errors import DatabaseError

if TYPE_CHECKING:
    from moetune.db.store import Store, open_store

__all__ = ["DatabaseError", "Store", "open_store"]


def __getattr__(name: str):
    # Lazy: `moetune.db.urls` (the default database path) must be importable without SQLAlchemy, which
    # the kernels' trace-time lookup asks for on every process start.
    if name in ("Store", "open_store"):
        from moetune.db import store

        return getattr(store, name)
    raise AttributeError(f"module 'moetune.db' has no attribute {name!r}")
