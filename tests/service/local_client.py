"""FastAPI's TestClient as a loopback client: its default Host, `testserver`, is one the server refuses
(service/hosts.py)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

LOOPBACK = "http://127.0.0.1"


def local_client(app: FastAPI, **options) -> TestClient:
    return TestClient(app, base_url=LOOPBACK, **options)
