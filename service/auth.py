"""The token check: writes always need `Authorization: Bearer <token>`; reads only when the server was
started with protect_reads. Compared in constant time.

Both dependencies declare the HTTP bearer scheme (BEARER), so the OpenAPI schema names it for every
route and /docs has an Authorize button; the header is checked here, not by the scheme's class."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import HTTPException, Request, Security, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="token",
    description="The server's write token (`$MOETUNE_SERVER_TOKEN` or its token file). Every write needs "
    "it; reads only on a server started with --protect-reads.",
)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)]


def token_matches(header: str, expected: str) -> bool:
    """Whether an Authorization header value is `Bearer <expected>` (constant time)."""
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(given.encode(), expected.encode())


def _authorized(request: Request) -> bool:
    return token_matches(request.headers.get("authorization", ""), request.app.state.settings.token)


def check_token(request: Request) -> None:
    if not _authorized(request):
        detail = "a write needs 'Authorization: Bearer <token>'"
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, detail, {"WWW-Authenticate": "Bearer"})


def check_read(request: Request) -> None:
    if request.app.state.settings.protect_reads:
        check_token(request)


async def require_token(request: Request, _: Credentials = None) -> None:
    """A dependency for every write route (async: a header comparison needs no worker thread)."""
    check_token(request)


async def require_read(request: Request, _: Credentials = None) -> None:
    """A dependency for every read route and page: open unless the server protects reads."""
    check_read(request)
