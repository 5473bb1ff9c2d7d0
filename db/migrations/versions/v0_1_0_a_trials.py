"""Trials: devices, kernels, problems, sweeps and every trial.

Revision ID: v0.1.0.a
Revises:
Create Date: 2026-11-29

Declares its own tables; never imports moetune.db.models, which describes only today's schema.
"""

import sqlalchemy as sa
from alembic import op

revision = "v0.1.0.a"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "devices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fingerprint_hash", sa.String(64), nullable=False),
        sa.Column("device_kind", sa.String(128), nullable=False),
        sa.Column("platform", sa.String(32), nullable=False),
        sa.Column("core_count", sa.Integer(), nullable=False),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=False),
        sa.Column("compute_capability", sa.String(32), nullable=False),
        sa.Column("driver", sa.String(64), nullable=False),
        sa.Column("runtime", sa.String(64), nullable=False),
        sa.Column("jax_version", sa.String(32), nullable=False),
        sa.Column("jaxlib_version", sa.String(32), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_devices"),
        sa.UniqueConstraint("fingerprint_hash", name="uq_devices_fingerprint_hash"),
    )
    op.create_index("ix_devices_device_kind", "devices", ["device_kind"])

    op.create_table(
        "kernels",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("backend", sa.String(64), nullable=False),
        sa.Column("family", sa.String(64), nullable=False),
        sa.Column("source_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_kernels"),
        sa.UniqueConstraint("backend", "family", "source_hash", name="uq_kernels_backend_family_source_hash"),
    )
    op.create_index("ix_kernels_backend", "kernels", ["backend"])

    op.create_table(
        "problems",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("shape_key", sa.String(255), nullable=False),
        sa.Column("op", sa.String(64), nullable=False),
        sa.Column("m", sa.Integer(), nullable=False),
        sa.Column("k", sa.Integer(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("g", sa.Integer(), nullable=False),
        sa.Column("lhs_dtype", sa.String(16), nullable=False),
        sa.Column("rhs_dtype", sa.String(16), nullable=False),
        sa.Column("out_dtype", sa.String(16), nullable=False),
        sa.Column("transpose_rhs", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_problems"),
        sa.UniqueConstraint("key", name="uq_problems_key"),
    )
    op.create_index("ix_problems_shape_key", "problems", ["shape_key"])

    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("backend", sa.String(64), nullable=False),
        sa.Column("strategy", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("username", sa.String(255), nullable=False),
        sa.Column("sweep_file", sa.String(1024), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_sweeps"),
    )

    op.create_table(
        "trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=True),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("kernel_id", sa.Integer(), nullable=False),
        sa.Column("problem_id", sa.Integer(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("samples_s", sa.JSON(), nullable=False),
        sa.Column("median_s", sa.Float(), nullable=True),
        sa.Column("compile_s", sa.Float(), nullable=True),
        sa.Column("verify_error", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("worker", sa.String(255), nullable=False),
        sa.Column("routing", sa.JSON(), nullable=True),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_trials"),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"], name="fk_trials_sweep_id_sweeps"),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"], name="fk_trials_device_id_devices"),
        sa.ForeignKeyConstraint(["kernel_id"], ["kernels.id"], name="fk_trials_kernel_id_kernels"),
        sa.ForeignKeyConstraint(["problem_id"], ["problems.id"], name="fk_trials_problem_id_problems"),
    )
    op.create_index("ix_trials_sweep_id", "trials", ["sweep_id"])
    op.create_index("ix_trials_status", "trials", ["status"])
    op.create_index(
        "ix_trials_device_id_kernel_id_problem_id", "trials", ["device_id", "kernel_id", "problem_id"]
    )


def downgrade() -> None:
    op.drop_table("trials")
    op.drop_table("sweeps")
    op.drop_table("problems")
    op.drop_table("kernels")
    op.drop_table("devices")
