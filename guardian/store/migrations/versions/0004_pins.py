"""Pins: the healthy checkpoints the guardian keeps out of verl's retention, and what each adds on disk.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _utc() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    """Add the pins table."""
    op.create_table(
        "pins",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("source_path", sa.Text(), nullable=False),
        sa.Column("pinned_path", sa.Text(), nullable=False),
        sa.Column("mode", sa.String(8), nullable=False),
        sa.Column("bytes_added", sa.BigInteger(), nullable=False),
        sa.Column("pinned_at", _utc(), nullable=False),
        sa.Column("released_at", _utc(), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_pins_run_id_runs"),
        sa.PrimaryKeyConstraint("id", name="pk_pins"),
    )
    op.create_index("ix_pins_run_id_released_at", "pins", ["run_id", "released_at"])


def downgrade() -> None:
    """Drop what upgrade added."""
    op.drop_index("ix_pins_run_id_released_at", table_name="pins")
    op.drop_table("pins")
