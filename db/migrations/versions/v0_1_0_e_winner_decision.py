"""Winner decisions: a JSON column holding how each promotion was decided (the interleaved re-timed medians
of every finalist and of the incumbent, by trial id and config; the rounds, the gain and the rule).

Revision ID: v0.1.0.e
Revises: v0.1.0.d
Create Date: 2026-12-05

Declares the column it adds; never imports moetune.db.models, which describes only today's schema.
Winners promoted before it keep their rows with decision NULL: they show their recorded median, said to be
one.
"""

import sqlalchemy as sa
from alembic import op

revision = "v0.1.0.e"
down_revision = "v0.1.0.d"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("winners", sa.Column("decision", sa.JSON(), nullable=True))


def downgrade() -> None:
    # A plain ALTER TABLE ... DROP COLUMN (SQLite >= 3.35), as in v0.1.0.c: rebuilding `winners` in batch
    # mode would drop a table while SQLite enforces foreign keys.
    op.drop_column("winners", "decision")
