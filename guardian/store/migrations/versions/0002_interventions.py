"""Interventions: the persisted rescue state machine and its event timeline.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _utc() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    """Add the interventions and intervention_events tables."""
    op.create_table(
        "interventions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("incident_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("rung", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("from_attempt_id", sa.Integer(), nullable=True),
        sa.Column("to_attempt_id", sa.Integer(), nullable=True),
        sa.Column("target_step", sa.Integer(), nullable=True),
        sa.Column("target_path", sa.Text(), nullable=True),
        sa.Column("plan_json", sa.Text(), nullable=True),
        sa.Column("created_at", _utc(), nullable=False),
        sa.Column("updated_at", _utc(), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_interventions_run_id_runs"),
        sa.ForeignKeyConstraint(["incident_id"], ["incidents.id"], name="fk_interventions_incident_id_incidents"),
        sa.ForeignKeyConstraint(["from_attempt_id"], ["attempts.id"], name="fk_interventions_from_attempt_id_attempts"),
        sa.ForeignKeyConstraint(["to_attempt_id"], ["attempts.id"], name="fk_interventions_to_attempt_id_attempts"),
        sa.PrimaryKeyConstraint("id", name="pk_interventions"),
        sa.UniqueConstraint("run_id", "number", name="uq_interventions_run_id_number"),
    )
    op.create_index("ix_interventions_incident_id", "interventions", ["incident_id"])
    op.create_table(
        "intervention_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("intervention_id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("at", _utc(), nullable=False),
        sa.Column("detail_json", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["intervention_id"],
            ["interventions.id"],
            name="fk_intervention_events_intervention_id_interventions",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_intervention_events"),
    )
    op.create_index("ix_intervention_events_intervention_id", "intervention_events", ["intervention_id"])


def downgrade() -> None:
    """Drop what upgrade added."""
    op.drop_index("ix_intervention_events_intervention_id", table_name="intervention_events")
    op.drop_table("intervention_events")
    op.drop_index("ix_interventions_incident_id", table_name="interventions")
    op.drop_table("interventions")
