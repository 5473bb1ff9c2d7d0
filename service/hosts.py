"""Only the configured host names are answered: a request whose Host header names another is refused
(400) before any route runs.

Why: reads are open by default, and a server on loopback is not out of a web page's reach. A page on
evil.example can have its name re-resolve to 127.0.0.1 (DNS rebinding) and then read the server as its
own origin; the browser still sends `Host: evil.example:8765`, which is what this check refuses. The
default names are the loopback ones (DEFAULT_HOSTS); a server opened to the network names its own
(`moetune serve --allowed-host NAME`).

Starlette's TrustedHostMiddleware is not used: it cuts the header at its first colon, so an IPv6 host
(`[::1]:8765`) can never match.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

DEFAULT_HOSTS = ("127.0.0.1", "::1", "localhost")


def host_name(header: str) -> str:
    """The name of a Host header, without its port and brackets, lower case: "[::1]:8765" -> "::1"."""
    header = header.strip().lower()
    if header.startswith("["):  # an IPv6 literal, maybe with a port after the bracket
        name, bracket, _ = header[1:].partition("]")
        return name if bracket else ""
    if header.count(":") > 1:  # a bare IPv6 literal (no port can follow one without brackets)
        return header
    return header.partition(":")[0].rstrip(".")


def normalized(names: Iterable[str]) -> frozenset[str]:
    return frozenset(host_name(name) for name in names)


class HostCheck:
    """ASGI middleware: HTTP requests whose Host is not in `allowed` get 400 and one line."""

    def __init__(self, app: ASGIApp, allowed: Iterable[str]) -> None:
        self.app = app
        self.allowed = normalized(allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan; the app has no websocket route
            await self.app(scope, receive, send)
            return
        host = ""
        for key, value in scope["headers"]:
            if key == b"host":
                host = value.decode("latin-1")
                break
        if host_name(host) in self.allowed:
            await self.app(scope, receive, send)
            return
        # The name is not echoed: the detail is the same whatever was sent.
        body = json.dumps({"detail": "host not allowed: this server answers only its configured host names"})
        await send(
            {
                "type": "http.response.start",
                "status": 400,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))],
            }
        )
        await send({"type": "http.response.body", "body": body.encode()})
