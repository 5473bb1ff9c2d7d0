"""What a server is started with. Everything has a safe default: loopback only, reads open to loopback
clients, writes behind a token, no cross-origin access, only the loopback host names answered."""

from __future__ import annotations

import re
import secrets

from pydantic import BaseModel, ConfigDict, Field, field_validator

from moetune.service.hosts import DEFAULT_HOSTS, host_name

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
ENV_TOKEN = "MOETUNE_SERVER_TOKEN"
ORIGIN = re.compile(r"https?://[A-Za-z0-9.\-]+(:[0-9]{1,5})?|https?://\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?")


class ServiceSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    db_url: str | None = None  # None: $MOETUNE_DB, else the default SQLite file (moetune.db.urls)
    token: str = Field(default_factory=lambda: secrets.token_urlsafe(24), min_length=16)
    protect_reads: bool = False  # True: every GET under /api and every page needs the token too
    cors_origins: tuple[str, ...] = ()  # empty: no CORS headers at all, browsers refuse cross-origin calls
    # The Host header names answered (service/hosts.py); any other is refused, against DNS rebinding.
    allowed_hosts: tuple[str, ...] = DEFAULT_HOSTS
    # Tune on miss (service/miss_scheduler.py): jobs queued per device kind each period; 0: off.
    tune_misses: int = Field(default=0, ge=0)
    tune_misses_budget: int | None = Field(default=None, ge=1)  # trials per job; None: the whole space
    tune_misses_period_s: float = Field(default=300.0, gt=0)

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, origins: tuple[str, ...]) -> tuple[str, ...]:
        for origin in origins:
            if origin.strip() in ("*", "null"):
                # "*" lets every web page read the API (and, with the token in a browser, more); "null" is
                # what sandboxed frames and file: pages send.
                raise ValueError(
                    f"CORS origin {origin!r} is refused: name each origin, e.g. https://grafana.example"
                )
            if not ORIGIN.fullmatch(origin):
                raise ValueError(f"CORS origin {origin!r} is not scheme://host[:port]")
        return origins

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, hosts: tuple[str, ...]) -> tuple[str, ...]:
        if not hosts:
            raise ValueError("allowed_hosts is empty: no request would be answered")
        for host in hosts:
            if not host_name(host) or "*" in host or "/" in host:
                raise ValueError(f"allowed host {host!r} is not a host name or address (no wildcards)")
        return hosts
