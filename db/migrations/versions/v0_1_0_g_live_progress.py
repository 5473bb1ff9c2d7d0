"""Live progress: a sweep's progress as its driver last published it (planned, done, failed, best so far,
ETA, lanes) and when; a job's log lines, a bounded tail per job (moetune.db.progress).

Revision ID: v0.1.0.g
Revises: v0.1.0.f
Create Date: 2026-12-04

Declares the columns and the table it adds; never imports moetune.db.models, which describes only today's
schema. Sweeps and jobs recorded before it keep their rows, with no progress and no log lines.
"""

import sqlalchemy as sa
from alembic import op

revision = "v0.1.0.g"
down_revision = "v0.1.0.f"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("sweeps", sa.Column("progress", sa.JSON(), nullable=True))
    op.add_column("sweeps", sa.Column("progress_at", sa.DateTime(), nullable=True))
    op.create_table(
        "job_logs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("line", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_job_logs"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_job_logs_job_id_jobs"),
    )
    op.create_index("ix_job_logs_job_id", "job_logs", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_job_logs_job_id", table_name="job_logs")
    op.drop_table("job_logs")
    op.drop_column("sweeps", "progress_at")
    op.drop_column("sweeps", "progress")
