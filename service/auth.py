"""The token check: writes always need `Authorization: Bearer <token>`; reads only when the server was
started with protect_reads. Compared in constant time."""

from __future__ import annotations

import secrets

from fastapi import HTTPException, Request, status


def _authorized(request: Request) -> bool:
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    expected = request.app.state.settings.token
    return scheme.lower() == "bearer" and secrets.compare_digest(given.encode(), expected.encode())


def require_token(request: Request) -> None:
    """A dependency for every write route."""
    if not _authorized(request):
        detail = "a write needs 'Authorization: Bearer <token>'"
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, detail, {"WWW-Authenticate": "Bearer"})


def require_read(request: Request) -> None:
    """A dependency for every read route and page: open unless the server protects reads."""
    if request.app.state.settings.protect_reads:
        require_token(request)
