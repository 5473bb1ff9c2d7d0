"""Trial details: a JSON column for what a trial found besides its times (compile-only binary facts).

Revision ID: v0.1.0.c
Revises: v0.1.0.b
Create Date: 2026-12-01

Declares the column it adds; never imports moetune.db.models, which describes only today's schema.
Existing trials keep their rows with details NULL.
"""

import sqlalchemy as sa
from alembic import op

revision = "v0.1.0.c"
down_revision = "v0.1.0.b"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("trials", sa.Column("details", sa.JSON(), nullable=True))


def downgrade() -> None:
    # A plain ALTER TABLE ... DROP COLUMN (SQLite >= 3.35): rebuilding `trials` in batch mode would drop
    # a table that winners reference while SQLite enforces foreign keys.
    op.drop_column("trials", "details")
