"""A real uvicorn server for a test: the app served on an ephemeral loopback port from a thread."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import uvicorn

from moetune.service.app import create_app
from moetune.service.settings import ServiceSettings

TOKEN = "t" * 24


@contextlib.contextmanager
def serving(db_url: str, *, app=None, **settings) -> Iterator[str]:
    """The server's base URL while the block runs; `app` replaces the one made from the settings."""
    app = app or create_app(ServiceSettings(db_url=db_url, token=TOKEN, **settings))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
