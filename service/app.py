"""The ASGI app: create_app(settings) wires the Store, the routers and the error handlers.

Errors: a moetune error becomes JSON {"detail": "<one line>"} with 400 (bad input), 404 (no such
record) or 503 (the database is unreachable); its text is already free of passwords (moetune.db.urls).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from moetune.db import DatabaseError, open_store
from moetune.db.errors import InvalidRecord, RecordNotFound
from moetune.kernels.errors import MoetuneError
from moetune.service import (
    api_docs,
    jobs_api,
    metrics,
    miss_scheduler,
    misses_api,
    packs_api,
    pages,
    pages_compare,
    pages_live,
    static_files,
    sweeps_api,
    winners_api,
)
from moetune.service.auth import require_read
from moetune.service.hosts import HostCheck
from moetune.service.json_body import one_line_validation_error
from moetune.service.listing_cache import ListingCache
from moetune.service.settings import ServiceSettings


def _status(error: MoetuneError) -> int:
    if isinstance(error, RecordNotFound):
        return 404
    if isinstance(error, InvalidRecord) or not isinstance(error, DatabaseError):
        return 400
    return 503  # the database is unreachable, or not moetune's


class HealthOut(BaseModel):
    status: str
    revision: str
    database: str


def create_app(settings: ServiceSettings) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # A server owns its database like `moetune tune` does: a fresh one is migrated to head, any other
        # revision refuses to start (SchemaMismatch names the fix).
        app.state.store = open_store(settings.db_url)
        try:
            with miss_scheduler.running_for(app.state.store, settings):
                yield
        finally:
            app.state.store.close()

    from importlib.metadata import version

    app = FastAPI(
        title="moetune",
        version=version("moetune"),
        summary="Tuned MoE grouped-GEMM configs, sweeps and a tuning queue over one SQL database.",
        lifespan=lifespan,
        # /docs and /redoc are served by api_docs, with Swagger UI's and ReDoc's files from this server.
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings

    @app.exception_handler(MoetuneError)
    async def _moetune_error(request: Request, error: MoetuneError) -> JSONResponse:
        return JSONResponse({"detail": str(error)}, status_code=_status(error))

    @app.get("/api/health", dependencies=[Depends(require_read)], tags=["service"], response_model=HealthOut)
    def health(request: Request) -> HealthOut:
        """The server is up and its database answers (its schema revision)."""
        store = request.app.state.store
        return HealthOut(status="ok", revision=store.revision() or "", database=store.dialect)

    routers = (
        winners_api,
        packs_api,
        sweeps_api,
        misses_api,
        jobs_api,
        metrics,
        api_docs,
        static_files,
        pages_live,
        pages_compare,
        pages,
    )
    for module in routers:
        app.include_router(module.router)
    app.add_exception_handler(RequestValidationError, one_line_validation_error)

    # Middleware added later runs earlier: HostCheck, then CORS (so a kept answer gets its headers too),
    # then the cache of listings and pages.
    app.add_middleware(
        ListingCache, settings=settings, version=lambda: packs_api.winners_version(app.state.store)
    )
    if settings.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins), allow_methods=["GET"])
    # Added last, so it runs first: a foreign Host header is refused before CORS or any route sees it.
    app.add_middleware(HostCheck, allowed=settings.allowed_hosts)
    return app
