"""Dependencies the routers share."""

from __future__ import annotations

from fastapi import Request

from moetune.db.store import Store


def store(request: Request) -> Store:
    """The app's one Store (thread-safe: an engine, a session per call)."""
    return request.app.state.store
