"""SQLAlchemy 2 declarative models: the guardian's persistent schema.

Any change needs a new Alembic revision in ``migrations/`` (``tests/integration/test_store.py`` checks they agree).
Timestamps are aware UTC; a step's values are one orjson blob, checked keys only. Only values the code bounds are
``String(n)``; anything chosen outside is ``StoredText`` (NUL becomes U+FFFD). Steps are ``BigInteger``; a
checkpoint is unique by ``(run_id, path_key)``, a digest of its path. Why: docs/ARCHITECTURE.md §8."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Final

from sqlalchemy import (
    BigInteger,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from guardian.ids import MAX_RUN_ID

PATH_KEY_LENGTH: Final = 64  # hex digits of a SHA-256

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base with a constraint naming convention (stable names for migrations)."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _utc() -> DateTime:
    return DateTime(timezone=True)


class StoredText(TypeDecorator[str]):
    """``Text`` whose NUL characters are written as U+FFFD (a trainer's last output line may hold one): PostgreSQL
    refuses NUL in text, and a crash incident refused for it would be lost."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return value.replace("\x00", "\ufffd") if value is not None else None


def path_key(path: str) -> str:
    """The key a checkpoint is unique by within its run: the SHA-256 of its path, in hex (a path of any length)."""
    return hashlib.sha256(path.encode("utf-8", errors="surrogatepass")).hexdigest()


class Run(Base):
    """One guarded training run."""

    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(MAX_RUN_ID), primary_key=True)
    name: Mapped[str] = mapped_column(StoredText)
    created_at: Mapped[datetime] = mapped_column(_utc())
    metrics_path: Mapped[str] = mapped_column(StoredText)
    rollouts_dir: Mapped[str] = mapped_column(StoredText)
    checkpoints_dir: Mapped[str | None] = mapped_column(StoredText)
    mode: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(32))
    config_json: Mapped[str | None] = mapped_column(StoredText)


class Attempt(Base):
    """One launch of the trainer for a run (the first start, then each resume)."""

    __tablename__ = "attempts"
    __table_args__ = (UniqueConstraint("run_id", "number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    number: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(_utc())
    ended_at: Mapped[datetime | None] = mapped_column(_utc())
    command_json: Mapped[str | None] = mapped_column(StoredText)
    metrics_path: Mapped[str] = mapped_column(StoredText)
    pid: Mapped[int | None] = mapped_column(Integer)
    exit_code: Mapped[int | None] = mapped_column(Integer)


class Step(Base):
    """All metric values of one step of one branch of one attempt, as one orjson blob of ``{key: float | null}``
    (never a row per value): of a metrics line only the keys the checks read (8.8 MB instead of 165 MB for 10,000
    steps × 300 keys), rollout statistics whole."""

    __tablename__ = "steps"
    __table_args__ = (
        UniqueConstraint("attempt_id", "branch", "step"),
        Index("ix_steps_run_id_step", "run_id", "step"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id"))
    branch: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(BigInteger)
    recorded_at: Mapped[datetime] = mapped_column(_utc())
    metrics: Mapped[bytes] = mapped_column(LargeBinary)


class Checkpoint(Base):
    """A checkpoint folder the guardian has seen, with its health verdict."""

    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("run_id", "path_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    step: Mapped[int] = mapped_column(BigInteger)
    path: Mapped[str] = mapped_column(StoredText)
    path_key: Mapped[str] = mapped_column(String(PATH_KEY_LENGTH))  # see path_key()
    found_at: Mapped[datetime] = mapped_column(_utc())
    verdict: Mapped[str] = mapped_column(String(16))
    note: Mapped[str | None] = mapped_column(StoredText)


class Pin(Base):
    """A healthy checkpoint the guardian pinned under ``<ckpt>/.guardian-pinned/`` (out of verl's retention's
    reach), how (``PinMode``), what it added on disk, and when it was released (None while it is kept)."""

    __tablename__ = "pins"
    __table_args__ = (Index("ix_pins_run_id_released_at", "run_id", "released_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    step: Mapped[int] = mapped_column(BigInteger)
    source_path: Mapped[str] = mapped_column(Text)
    pinned_path: Mapped[str] = mapped_column(Text)
    mode: Mapped[str] = mapped_column(String(8))
    bytes_added: Mapped[int] = mapped_column(BigInteger)
    pinned_at: Mapped[datetime] = mapped_column(_utc())
    released_at: Mapped[datetime | None] = mapped_column(_utc())
    note: Mapped[str | None] = mapped_column(Text)


class Incident(Base):
    """A problem the guardian tracks from detection to closing (the intervention state machine)."""

    __tablename__ = "incidents"
    __table_args__ = (Index("ix_incidents_run_id_status", "run_id", "status"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    check: Mapped[str] = mapped_column(String(64))
    severity: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(32))
    opened_at: Mapped[datetime] = mapped_column(_utc())
    opened_step: Mapped[int | None] = mapped_column(BigInteger)
    onset_step: Mapped[int | None] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(_utc())
    closed_at: Mapped[datetime | None] = mapped_column(_utc())
    closed_step: Mapped[int | None] = mapped_column(BigInteger)
    message: Mapped[str] = mapped_column(StoredText)
    evidence_json: Mapped[str] = mapped_column(StoredText)
    note: Mapped[str | None] = mapped_column(StoredText)


class FindingRow(Base):
    """One check's verdict at one step (only the ones worth keeping: not OK)."""

    __tablename__ = "findings"
    __table_args__ = (
        Index("ix_findings_run_id", "run_id"),
        Index("ix_findings_incident_id", "incident_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    attempt_id: Mapped[int | None] = mapped_column(ForeignKey("attempts.id"))
    check: Mapped[str] = mapped_column(String(64))
    severity: Mapped[str] = mapped_column(String(16))
    step: Mapped[int | None] = mapped_column(BigInteger)
    onset_step: Mapped[int | None] = mapped_column(BigInteger)
    message: Mapped[str] = mapped_column(StoredText)
    evidence_json: Mapped[str] = mapped_column(StoredText)
    created_at: Mapped[datetime] = mapped_column(_utc())
    incident_id: Mapped[int | None] = mapped_column(ForeignKey("incidents.id"))


class Intervention(Base):
    """One pass of the rescue for an incident: stop, roll back, patch, resume, verify (or restart after
    a crash or stall). Its ``state`` is committed before each side effect, so a restarted guardian
    knows exactly which step to finish (docs/ARCHITECTURE.md §4)."""

    __tablename__ = "interventions"
    __table_args__ = (
        UniqueConstraint("run_id", "number"),
        Index("ix_interventions_incident_id", "incident_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    incident_id: Mapped[int] = mapped_column(ForeignKey("incidents.id"))
    number: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    rung: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(32))
    from_attempt_id: Mapped[int | None] = mapped_column(ForeignKey("attempts.id"))
    to_attempt_id: Mapped[int | None] = mapped_column(ForeignKey("attempts.id"))
    target_step: Mapped[int | None] = mapped_column(BigInteger)
    target_path: Mapped[str | None] = mapped_column(StoredText)
    plan_json: Mapped[str | None] = mapped_column(StoredText)
    created_at: Mapped[datetime] = mapped_column(_utc())
    updated_at: Mapped[datetime] = mapped_column(_utc())
    note: Mapped[str | None] = mapped_column(StoredText)


class InterventionEvent(Base):
    """Every state an intervention entered, when, and with what detail (the incident timeline)."""

    __tablename__ = "intervention_events"
    __table_args__ = (Index("ix_intervention_events_intervention_id", "intervention_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    intervention_id: Mapped[int] = mapped_column(ForeignKey("interventions.id"))
    state: Mapped[str] = mapped_column(String(32))
    at: Mapped[datetime] = mapped_column(_utc())
    detail_json: Mapped[str] = mapped_column(StoredText)


class Delivery(Base):
    """One event (``guardian.notify.events`` key) as one sink handled it: sent, suppressed, failing or
    dropped. The dispatcher's outbox bookkeeping: what a sink has had survives a guardian restart."""

    __tablename__ = "deliveries"
    __table_args__ = (UniqueConstraint("run_id", "sink", "event_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    sink: Mapped[str] = mapped_column(String(64))
    event_key: Mapped[str] = mapped_column(String(128))
    check: Mapped[str] = mapped_column(String(64))
    level: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(_utc())
    external_id: Mapped[str | None] = mapped_column(StoredText)
    last_error: Mapped[str | None] = mapped_column(StoredText)


class Evaluation(Base):
    """An evaluation result a person recorded for a run (``guardian checklist --eval name=value``): the launch
    checklist judges the newest value of each name."""

    __tablename__ = "evaluations"
    __table_args__ = (Index("ix_evaluations_run_id", "run_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    name: Mapped[str] = mapped_column(String(128))
    value: Mapped[float] = mapped_column(Float)
    step: Mapped[int | None] = mapped_column(BigInteger)  # the run's newest step when it was recorded
    recorded_at: Mapped[datetime] = mapped_column(_utc())
