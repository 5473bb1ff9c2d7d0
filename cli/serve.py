"""`moetune serve`: the REST API and dashboard over the database, served by uvicorn.

Order of start-up: every check that writes nothing (options, the token file, the database URL), then the
listening socket (an address in use or not of this machine is one line, exit 2), then the database
(created and migrated when fresh) and the token file, then uvicorn on the socket already bound: nothing is
created, and nothing says "serving", for a server that could not listen.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated

import typer

from moetune.cli import app
from moetune.cli.common import DbOption, check_range, console, fail
from moetune.kernels.errors import MoetuneError


@app.command()
def serve(
    db: DbOption = None,
    host: Annotated[
        str, typer.Option("--host", help="Address to bind; any but loopback opens the API to the network.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 8765,
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file",
            help="File holding the write token (created 0600 if missing); $MOETUNE_SERVER_TOKEN wins.",
            show_default="server-token in the user data directory",
        ),
    ] = None,
    protect_reads: Annotated[
        bool, typer.Option("--protect-reads/--open-reads", help="Whether reads need the token too.")
    ] = False,
    cors_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--cors-origin",
            help="An origin allowed to call the API from a browser (repeatable).",
            show_default="none: no cross-origin calls",
        ),
    ] = None,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-host",
            help="A host name clients use for this server, answered besides the loopback ones and --host "
            "(repeatable); a request naming any other Host is refused.",
            show_default="127.0.0.1, ::1, localhost and --host",
        ),
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            help="Server processes sharing the address (each its own caches and database connections); "
            "as many as the machine has cores under heavy load.",
        ),
    ] = 1,
    tune_misses: Annotated[
        int,
        typer.Option(
            "--tune-misses",
            help="Tune on miss: queue jobs for the N most-missed problems of each device kind, every 5 min.",
        ),
    ] = 0,
    tune_misses_budget: Annotated[
        int | None,
        typer.Option("--tune-misses-budget", help="Trials per tune-on-miss job.", show_default="no limit"),
    ] = None,
) -> None:
    """Serve winners, packs, sweeps, misses and the tuning queue over HTTP, with a dashboard at /."""
    import uvicorn
    from pydantic import ValidationError

    from moetune.db import open_store, urls
    from moetune.service import token_file as tokens
    from moetune.service.app import create_app
    from moetune.service.hosts import DEFAULT_HOSTS
    from moetune.service.settings import ServiceSettings

    check_range("--port", port, low=1)
    check_range("--tune-misses", tune_misses, low=0)
    check_range("--workers", workers, low=1)
    check_range("--tune-misses-budget", tune_misses_budget)
    if port > 65535:
        fail(f"--port {port} is not in [1, 65535]")
    hosts = [*DEFAULT_HOSTS, *([host] if host not in WILDCARDS else []), *(allowed_host or ())]
    try:
        options = dict(cors_origins=tuple(cors_origin or ()), allowed_hosts=tuple(dict.fromkeys(hosts)))
        ServiceSettings(**options)  # a wildcard CORS origin or a bad host name fails here
    except ValidationError as e:
        fail(e.errors()[0]["msg"].removeprefix("Value error, "))
    try:
        tokens.resolve(token_file, create=False)  # a bad token file fails before anything is written
        urls.parse(urls.resolve(db))  # so does a malformed database URL
    except MoetuneError as e:
        fail(str(e))
    listening = _listen(host, port)
    try:
        # Open (and migrate a fresh) database now: a bad --db is one line here, not a failed start-up
        # inside uvicorn.
        open_store(db).close()
        token, source = tokens.resolve(token_file)
        settings = ServiceSettings(
            db_url=db,
            token=token,
            protect_reads=protect_reads,
            tune_misses=tune_misses,
            tune_misses_budget=tune_misses_budget,
            **options,
        )
        application = create_app(settings)
    except MoetuneError as e:
        listening.close()
        fail(str(e))
    processes = f", {workers} processes" if workers > 1 else ""
    where = f"moetune serving on http://{_shown(host)}:{port} (write token: {source}{processes})"
    console.print(where, markup=False, highlight=False, soft_wrap=True)  # one line, however long
    children = [_fork_server(settings, listening) for _ in range(workers - 1)]
    try:
        config = uvicorn.Config(application, log_level="info", server_header=False)
        uvicorn.Server(config).run(sockets=[listening])
    finally:
        _stop(children)


def _fork_server(settings: object, listening: socket.socket) -> int:
    """One more server process on the same socket (the kernel spreads connections over them); its pid.
    It tunes no misses (the first process does) and ends with its parent."""
    import os

    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        import signal

        import uvicorn

        from moetune.service.app import create_app

        _die_with_parent(signal.SIGTERM)
        application = create_app(settings.model_copy(update={"tune_misses": 0}))  # type: ignore[attr-defined]
        uvicorn.Server(uvicorn.Config(application, log_level="warning", server_header=False)).run(
            sockets=[listening]
        )
    except BaseException:  # noqa: BLE001 (a forked child must never return into the parent's code)
        code = 1
    finally:
        os._exit(code)


def _die_with_parent(signal_number: int) -> None:
    """Linux: the kernel sends `signal_number` to this process when its parent dies (prctl
    PR_SET_PDEATHSIG), so a killed server leaves no process behind. Elsewhere nothing."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(1, signal_number)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _stop(children: list[int]) -> None:
    import os
    import signal

    for pid in children:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for pid in children:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


WILDCARDS = ("0.0.0.0", "::", "")


def _shown(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound and listening; a failure is one line, exit 2."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        fail(f"cannot listen on {_shown(host)}:{port}: {e.strerror or e}")
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a quick restart binds
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        fail(f"cannot listen on {_shown(host)}:{port}: {e.strerror or e}")
    sock.set_inheritable(True)
    return sock
