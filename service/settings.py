"""What a server is started with. Everything has a safe default: loopback only, reads open to loopback
clients, writes behind a token, no cross-origin access."""

from __future__ import annotations

import secrets

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
ENV_TOKEN = "MOETUNE_SERVER_TOKEN"


class ServiceSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    db_url: str | None = None  # None: $MOETUNE_DB, else the default SQLite file (moetune.db.urls)
    token: str = Field(default_factory=lambda: secrets.token_urlsafe(24), min_length=16)
    protect_reads: bool = False  # True: every GET under /api and every page needs the token too
    cors_origins: tuple[str, ...] = ()  # empty: no CORS headers at all, browsers refuse cross-origin calls
    # Tune on miss (service/miss_scheduler.py): jobs queued per device kind each period; 0: off.
    tune_misses: int = Field(default=0, ge=0)
    tune_misses_budget: int | None = Field(default=None, ge=1)  # trials per job; None: the whole space
    tune_misses_period_s: float = Field(default=300.0, gt=0)
