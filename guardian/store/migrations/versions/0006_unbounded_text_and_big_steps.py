"""Free text and paths as text, step numbers as 64-bit, checkpoints unique by a digest of their path
(``path_key``, filled in here for existing rows). On SQLite altered tables are rebuilt with foreign keys off and
checked before commit (``engine._upgrade``).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-10"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STEP_COLUMNS: dict[str, tuple[tuple[str, bool], ...]] = {  # table: (column, nullable)
    "steps": (("step", False),),
    "checkpoints": (("step", False),),
    "pins": (("step", False),),
    "incidents": (("opened_step", True), ("onset_step", True), ("closed_step", True)),
    "findings": (("step", True), ("onset_step", True)),
    "interventions": (("target_step", True),),
    "evaluations": (("step", True),),
}
TEXT_COLUMNS: dict[str, tuple[tuple[str, int, bool], ...]] = {  # table: (column, old width, nullable)
    "runs": (("name", 255, False),),
    "checkpoints": (("path", 1024, False),),
    "deliveries": (("external_id", 128, True),),
}


def _digest(path: str) -> str:
    """``models.path_key`` as of this revision (a migration never imports the models: they move on)."""
    return hashlib.sha256(path.encode("utf-8", errors="surrogatepass")).hexdigest()


def _fill_path_keys() -> None:
    bind = op.get_bind()
    checkpoints = sa.table("checkpoints", sa.column("id", sa.Integer()), sa.column("path", sa.Text()))
    keys = sa.table("checkpoints", sa.column("id", sa.Integer()), sa.column("path_key", sa.String(64)))
    found = bind.execute(sa.select(checkpoints.c.id, checkpoints.c.path)).all()
    if found:
        update = sa.update(keys).where(keys.c.id == sa.bindparam("row_id")).values(path_key=sa.bindparam("key"))
        bind.execute(update, [{"row_id": row_id, "key": _digest(path)} for row_id, path in found])


def upgrade() -> None:
    """Widen the columns, then key checkpoints by the digest of their path."""
    with op.batch_alter_table("checkpoints") as batch:
        batch.add_column(sa.Column("path_key", sa.String(64), nullable=True))
    _fill_path_keys()
    for table in sorted(STEP_COLUMNS.keys() | TEXT_COLUMNS.keys()):
        with op.batch_alter_table(table) as batch:
            for column, nullable in STEP_COLUMNS.get(table, ()):
                batch.alter_column(
                    column, existing_type=sa.Integer(), type_=sa.BigInteger(), existing_nullable=nullable
                )
            for column, width, nullable in TEXT_COLUMNS.get(table, ()):
                batch.alter_column(column, existing_type=sa.String(width), type_=sa.Text(), existing_nullable=nullable)
            if table == "checkpoints":
                batch.alter_column("path_key", existing_type=sa.String(64), nullable=False)
                batch.drop_constraint("uq_checkpoints_run_id_path", type_="unique")
                batch.create_unique_constraint("uq_checkpoints_run_id_path_key", ["run_id", "path_key"])


def downgrade() -> None:
    """Narrow the columns back (fails on PostgreSQL where a value no longer fits) and key checkpoints by path."""
    for table in sorted(STEP_COLUMNS.keys() | TEXT_COLUMNS.keys()):
        with op.batch_alter_table(table) as batch:
            if table == "checkpoints":
                batch.drop_constraint("uq_checkpoints_run_id_path_key", type_="unique")
                batch.drop_column("path_key")
                batch.create_unique_constraint("uq_checkpoints_run_id_path", ["run_id", "path"])
            for column, nullable in STEP_COLUMNS.get(table, ()):
                batch.alter_column(
                    column, existing_type=sa.BigInteger(), type_=sa.Integer(), existing_nullable=nullable
                )
            for column, width, nullable in TEXT_COLUMNS.get(table, ()):
                batch.alter_column(column, existing_type=sa.Text(), type_=sa.String(width), existing_nullable=nullable)
