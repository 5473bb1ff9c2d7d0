"""Alembic migrations of moetune's schema; run them with `moetune db upgrade` (moetune.db.schema)."""
