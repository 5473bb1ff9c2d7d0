"""The simulated backend of the tuner tests, for the driver's stop."""

from tests.tuner.conftest import sim  # noqa: F401
