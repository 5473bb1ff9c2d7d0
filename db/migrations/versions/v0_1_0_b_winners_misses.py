"""Serving: winners (with history) and dispatch misses.

Revision ID: v0.1.0.b
Revises: v0.1.0.a
Create Date: 2026-11-29

Declares its own tables; never imports moetune.db.models, which describes only today's schema.
"""

import sqlalchemy as sa
from alembic import op

revision = "v0.1.0.b"
down_revision = "v0.1.0.a"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "winners",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("backend", sa.String(64), nullable=False),
        sa.Column("problem_id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("promoted_at", sa.DateTime(), nullable=False),
        sa.Column("retired_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_winners"),
        sa.ForeignKeyConstraint(["trial_id"], ["trials.id"], name="fk_winners_trial_id_trials"),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"], name="fk_winners_device_id_devices"),
        sa.ForeignKeyConstraint(["problem_id"], ["problems.id"], name="fk_winners_problem_id_problems"),
    )
    op.create_index(
        "ix_winners_device_id_backend_problem_id", "winners", ["device_id", "backend", "problem_id"]
    )
    # At most one active winner per key; superseded and rolled-back rows stay as history.
    op.create_index(
        "uq_winners_active",
        "winners",
        ["device_id", "backend", "problem_id"],
        unique=True,
        sqlite_where=sa.text("state = 'active'"),
        postgresql_where=sa.text("state = 'active'"),
    )

    op.create_table(
        "misses",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("backend", sa.String(64), nullable=False),
        sa.Column("problem_id", sa.Integer(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("first_seen", sa.DateTime(), nullable=False),
        sa.Column("last_seen", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_misses"),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"], name="fk_misses_device_id_devices"),
        sa.ForeignKeyConstraint(["problem_id"], ["problems.id"], name="fk_misses_problem_id_problems"),
        sa.UniqueConstraint(
            "device_id", "backend", "problem_id", name="uq_misses_device_id_backend_problem_id"
        ),
    )


def downgrade() -> None:
    op.drop_table("misses")
    op.drop_table("winners")
