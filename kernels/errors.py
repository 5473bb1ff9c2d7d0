"""Typed errors shared by every layer; the tuner maps them to trial status by type, never by message text."""


class MoetuneError(Exception):
    """Base of every error moetune raises on purpose."""


class ConfigInvalid(MoetuneError, ValueError):
    """A config breaks a rule of its own (checked at construction) or a constraint for a problem."""


class Unsupported(MoetuneError, NotImplementedError):
    """A backend declines a problem, dtype or device; dispatch falls through to the next choice."""


class ResourceExceeded(MoetuneError):
    """A config needs more of a hardware resource (shared memory, registers) than the device has."""


class WrongResult(MoetuneError):
    """A candidate's output differs from the reference beyond the dtype's tolerance, or holds NaN."""


class UnknownBackend(MoetuneError, KeyError):
    """No backend of that name is registered."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class PackInvalid(MoetuneError, ValueError):
    """A config pack file is corrupt, of an unknown schema version, or for something else entirely."""
