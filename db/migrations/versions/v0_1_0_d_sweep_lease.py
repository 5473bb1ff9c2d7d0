"""Sweep lease: who runs a sweep (host, pid, random token), its last heartbeat, and the device it times on.

Revision ID: v0.1.0.d
Revises: v0.1.0.c
Create Date: 2026-12-03

Declares the columns it adds; never imports moetune.db.models, which describes only today's schema.
Sweeps recorded before it keep their rows with every new column NULL: no owner and no heartbeat, so one
still marked running shows as dead (moetune.db.leases) and `moetune tune --resume` takes it over.
"""

import sqlalchemy as sa
from alembic import op

revision = "v0.1.0.d"
down_revision = "v0.1.0.c"
branch_labels = None
depends_on = None

COLUMNS = ("owner_host", "owner_pid", "owner_token", "heartbeat_at", "device_id")


def upgrade() -> None:
    op.add_column("sweeps", sa.Column("owner_host", sa.String(255), nullable=True))
    op.add_column("sweeps", sa.Column("owner_pid", sa.Integer(), nullable=True))
    op.add_column("sweeps", sa.Column("owner_token", sa.String(32), nullable=True))
    op.add_column("sweeps", sa.Column("heartbeat_at", sa.DateTime(), nullable=True))
    if op.get_bind().dialect.name == "sqlite":
        # SQLite has no ALTER TABLE ... ADD CONSTRAINT: a new column's foreign key can only come inline.
        op.execute("ALTER TABLE sweeps ADD COLUMN device_id INTEGER REFERENCES devices (id)")
    else:
        device = sa.ForeignKey("devices.id", name="fk_sweeps_device_id_devices")
        op.add_column("sweeps", sa.Column("device_id", sa.Integer(), device, nullable=True))
    # Two timing sweeps on one device are refused: the check looks sweeps up by device.
    op.create_index("ix_sweeps_device_id", "sweeps", ["device_id"])


def downgrade() -> None:
    # Plain ALTER TABLE ... DROP COLUMN (SQLite >= 3.35), as in v0.1.0.c; SQLite drops no indexed
    # column, so the index goes first.
    op.drop_index("ix_sweeps_device_id", table_name="sweeps")
    for name in reversed(COLUMNS):
        op.drop_column("sweeps", name)
