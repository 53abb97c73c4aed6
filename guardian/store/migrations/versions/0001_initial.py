"""Initial schema: runs, attempts, steps, checkpoints, incidents, findings.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _utc() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    """Create every table and index of the first schema version."""
    op.create_table(
        "runs",
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("created_at", _utc(), nullable=False),
        sa.Column("metrics_path", sa.Text(), nullable=False),
        sa.Column("rollouts_dir", sa.Text(), nullable=False),
        sa.Column("checkpoints_dir", sa.Text(), nullable=True),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("config_json", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
    )
    op.create_table(
        "attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("started_at", _utc(), nullable=False),
        sa.Column("ended_at", _utc(), nullable=True),
        sa.Column("command_json", sa.Text(), nullable=True),
        sa.Column("metrics_path", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_attempts_run_id_runs"),
        sa.PrimaryKeyConstraint("id", name="pk_attempts"),
        sa.UniqueConstraint("run_id", "number", name="uq_attempts_run_id_number"),
    )
    op.create_table(
        "steps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("attempt_id", sa.Integer(), nullable=False),
        sa.Column("branch", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("recorded_at", _utc(), nullable=False),
        sa.Column("metrics", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempts.id"], name="fk_steps_attempt_id_attempts"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_steps_run_id_runs"),
        sa.PrimaryKeyConstraint("id", name="pk_steps"),
        sa.UniqueConstraint("attempt_id", "branch", "step", name="uq_steps_attempt_id_branch_step"),
    )
    op.create_index("ix_steps_run_id_step", "steps", ["run_id", "step"])
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("path", sa.String(1024), nullable=False),
        sa.Column("found_at", _utc(), nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_checkpoints_run_id_runs"),
        sa.PrimaryKeyConstraint("id", name="pk_checkpoints"),
        sa.UniqueConstraint("run_id", "path", name="uq_checkpoints_run_id_path"),
    )
    op.create_table(
        "incidents",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("check", sa.String(64), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("opened_at", _utc(), nullable=False),
        sa.Column("opened_step", sa.Integer(), nullable=True),
        sa.Column("onset_step", sa.Integer(), nullable=True),
        sa.Column("updated_at", _utc(), nullable=False),
        sa.Column("closed_at", _utc(), nullable=True),
        sa.Column("closed_step", sa.Integer(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("evidence_json", sa.Text(), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_incidents_run_id_runs"),
        sa.PrimaryKeyConstraint("id", name="pk_incidents"),
    )
    op.create_index("ix_incidents_run_id_status", "incidents", ["run_id", "status"])
    op.create_table(
        "findings",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("attempt_id", sa.Integer(), nullable=True),
        sa.Column("check", sa.String(64), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("onset_step", sa.Integer(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("evidence_json", sa.Text(), nullable=False),
        sa.Column("created_at", _utc(), nullable=False),
        sa.Column("incident_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempts.id"], name="fk_findings_attempt_id_attempts"),
        sa.ForeignKeyConstraint(["incident_id"], ["incidents.id"], name="fk_findings_incident_id_incidents"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_findings_run_id_runs"),
        sa.PrimaryKeyConstraint("id", name="pk_findings"),
    )
    op.create_index("ix_findings_run_id", "findings", ["run_id"])
    op.create_index("ix_findings_incident_id", "findings", ["incident_id"])


def downgrade() -> None:
    """Drop everything (history is lost)."""
    op.drop_index("ix_findings_incident_id", table_name="findings")
    op.drop_index("ix_findings_run_id", table_name="findings")
    op.drop_table("findings")
    op.drop_index("ix_incidents_run_id_status", table_name="incidents")
    op.drop_table("incidents")
    op.drop_table("checkpoints")
    op.drop_index("ix_steps_run_id_step", table_name="steps")
    op.drop_table("steps")
    op.drop_table("attempts")
    op.drop_table("runs")
