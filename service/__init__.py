"""`moetune serve`: the tuning service over the same SQL database the CLI uses.

An ASGI app (FastAPI, served by uvicorn) with a REST API under /api (winners, config packs, sweeps,
trials, misses, jobs), a dashboard of server-rendered pages, and a token for every write. One Store per
app (one engine; a session per call, so request threads share it safely).
"""
