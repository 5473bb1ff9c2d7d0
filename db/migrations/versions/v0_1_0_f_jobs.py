"""Jobs: the tuning queue. Each row is a validated sweep spec waiting for a worker, or the worker running
it (host, pid, random token, last heartbeat, as a sweep's lease), the sweep it created, its attempts.

Revision ID: v0.1.0.f
Revises: v0.1.0.e
Create Date: 2026-12-07

Declares the table it creates; never imports moetune.db.models, which describes only today's schema.
"""

import sqlalchemy as sa
from alembic import op

revision = "v0.1.0.f"
down_revision = "v0.1.0.e"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("sweep_file", sa.String(1024), nullable=True),
        sa.Column("device_kind", sa.String(128), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("submitted_by", sa.String(255), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("claimed_at", sa.DateTime(), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("owner_host", sa.String(255), nullable=True),
        sa.Column("owner_pid", sa.Integer(), nullable=True),
        sa.Column("owner_token", sa.String(32), nullable=True),
        sa.Column("sweep_id", sa.Integer(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"], name="fk_jobs_sweep_id_sweeps"),
    )
    op.create_index("ix_jobs_state_priority", "jobs", ["state", "priority"])


def downgrade() -> None:
    op.drop_index("ix_jobs_state_priority", table_name="jobs")
    op.drop_table("jobs")
