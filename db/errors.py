"""Errors of the database layer. Every failure of the database itself surfaces as DatabaseError, one line.

The subclasses let callers react by type: a schema that needs `moetune db upgrade`, a row that is not
there, a request that breaks a rule of the data (promote a crashed trial, roll back the first winner), a
sweep that another process runs (its lease, moetune.db.leases).
"""

from moetune.kernels.errors import MoetuneError


class DatabaseError(MoetuneError):
    """The database failed or refused: unreachable, bad URL, locked past all retries, constraint broken."""


class SchemaMismatch(DatabaseError):
    """The database's schema revision is not the one this moetune needs (older, newer or unversioned)."""


class RecordNotFound(DatabaseError, LookupError):
    """No row with that id or key (sweep, trial, problem, device)."""


class InvalidRecord(DatabaseError, ValueError):
    """A value or request that breaks a rule of the data: unknown status, nothing to roll back to."""


class NoDatabase(DatabaseError):
    """A read-only command found no database (no SQLite file, or no moetune tables) to read."""


class LeaseHeld(DatabaseError):
    """Another live process runs that sweep (moetune.db.leases)."""


class LeaseLost(DatabaseError):
    """This process's lease on its sweep was taken over by another process; it must stop writing."""


class DeviceBusy(DatabaseError):
    """Another live sweep times on the same device fingerprint (refused unless forced)."""
