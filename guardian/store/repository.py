"""The one repository object over the guardian's SQL history, and the views it hands out.

``Store`` owns the engine and every session; callers get frozen view dataclasses, never ORM objects.
Time is injected: every method that writes a timestamp takes ``now`` (float epoch seconds) and stores
it as a timezone-aware UTC ``DateTime``; views hand timestamps back as aware UTC ``datetime``.

SQLite (the default) is opened in WAL mode with ``busy_timeout=5000``, ``synchronous=NORMAL`` and
``foreign_keys=ON`` on every connection; SQLAlchemy emits the ``BEGIN`` itself (``BEGIN IMMEDIATE``
for write transactions), so readers never block the writer and two writers queue on the lock instead
of failing half-way. Opening a store runs ``alembic upgrade head``, so history survives upgrades.

Step timelines: every (attempt, branch) is one *line* of steps; lines are ordered by attempt number,
then branch. The *active timeline* of a run takes all steps of the newest line, then the steps of each
older line that lie before the first step of every newer line (a resume or rollback abandons what an
older line logged from that point on) - the same view ``history.RunHistory`` keeps in memory.
"""

from __future__ import annotations

import math
import re
import sqlite3
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Final, Self, SupportsFloat

import orjson
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, Engine, create_engine, event, func, insert, select, update
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from guardian.findings import EvidenceValue, Finding, Severity
from guardian.history import StepRecord
from guardian.store.models import Attempt, Checkpoint, FindingRow, Incident, Run, Step

MIGRATIONS_DIR: Final = Path(__file__).resolve().parent / "migrations"

MODES: Final = frozenset({"observe", "advise", "enforce"})
VERDICTS: Final = frozenset({"healthy", "unhealthy", "unknown"})
RUN_STATUS_ACTIVE: Final = "active"
INCIDENT_OPEN: Final = "open"
CLOSED_INCIDENT_STATUSES: Final = frozenset({"resolved", "gave_up", "dismissed"})

_WRITE_OPTION: Final = "guardian_write"
_SQLITE_PRAGMAS: Final = (
    "PRAGMA busy_timeout=5000",
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=NORMAL",
    "PRAGMA foreign_keys=ON",
)
_IN_CHUNK: Final = 500
_PASSWORD_IN_URL = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")

StepValues = dict[str, float | None]


class StoreError(RuntimeError):
    """The store cannot be opened or used; the message names the URL with its password masked."""


class NotFoundError(StoreError, LookupError):
    """A run, attempt or incident id that the store does not hold."""


def mask_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (also when it does not parse)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return _PASSWORD_IN_URL.sub(r"\1***@", url)


def head_revision() -> str:
    """The newest schema revision this version of the guardian ships."""
    head = ScriptDirectory.from_config(_alembic_config(None)).get_current_head()
    if head is None:
        raise StoreError("the packaged migrations have no head revision")
    return head


# ---------------------------------------------------------------------------------------------- views


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


@dataclass(frozen=True, slots=True)
class RunView:
    """A guarded run."""

    id: str
    name: str
    created_at: datetime
    metrics_path: str
    rollouts_dir: str
    checkpoints_dir: str | None
    mode: str
    status: str
    config_json: str | None

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "name": self.name,
            "created_at": _iso(self.created_at),
            "metrics_path": self.metrics_path,
            "rollouts_dir": self.rollouts_dir,
            "checkpoints_dir": self.checkpoints_dir,
            "mode": self.mode,
            "status": self.status,
            "config": _loads_lenient(self.config_json),
        }


@dataclass(frozen=True, slots=True)
class AttemptView:
    """One launch of the trainer."""

    id: int
    run_id: str
    number: int
    started_at: datetime
    ended_at: datetime | None
    command: object
    metrics_path: str
    pid: int | None
    exit_code: int | None

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "run_id": self.run_id,
            "number": self.number,
            "started_at": _iso(self.started_at),
            "ended_at": _iso(self.ended_at),
            "command": self.command,
            "metrics_path": self.metrics_path,
            "pid": self.pid,
            "exit_code": self.exit_code,
        }


@dataclass(frozen=True, slots=True)
class CheckpointView:
    """A checkpoint and its verdict."""

    id: int
    run_id: str
    step: int
    path: str
    found_at: datetime
    verdict: str
    note: str | None

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "run_id": self.run_id,
            "step": self.step,
            "path": self.path,
            "found_at": _iso(self.found_at),
            "verdict": self.verdict,
            "note": self.note,
        }


@dataclass(frozen=True, slots=True)
class FindingView:
    """A stored finding."""

    id: int
    run_id: str
    attempt_id: int | None
    check: str
    severity: Severity
    step: int | None
    onset_step: int | None
    message: str
    evidence: Mapping[str, EvidenceValue]
    created_at: datetime
    incident_id: int | None

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "run_id": self.run_id,
            "attempt_id": self.attempt_id,
            "check": self.check,
            "severity": self.severity.label,
            "step": self.step,
            "onset_step": self.onset_step,
            "message": self.message,
            "evidence": dict(self.evidence),
            "created_at": _iso(self.created_at),
            "incident_id": self.incident_id,
        }


@dataclass(frozen=True, slots=True)
class IncidentView:
    """An incident: what went wrong, how bad it got, where it stands."""

    id: int
    run_id: str
    check: str
    severity: Severity
    status: str
    opened_at: datetime
    opened_step: int | None
    onset_step: int | None
    updated_at: datetime
    closed_at: datetime | None
    closed_step: int | None
    message: str
    evidence: Mapping[str, EvidenceValue]
    note: str | None

    @property
    def is_open(self) -> bool:
        return self.status not in CLOSED_INCIDENT_STATUSES

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "run_id": self.run_id,
            "check": self.check,
            "severity": self.severity.label,
            "status": self.status,
            "opened_at": _iso(self.opened_at),
            "opened_step": self.opened_step,
            "onset_step": self.onset_step,
            "updated_at": _iso(self.updated_at),
            "closed_at": _iso(self.closed_at),
            "closed_step": self.closed_step,
            "message": self.message,
            "evidence": dict(self.evidence),
            "note": self.note,
        }


@dataclass(frozen=True, slots=True)
class IncidentDetail:
    """An incident with its findings, oldest first."""

    incident: IncidentView
    findings: tuple[FindingView, ...]

    def to_json(self) -> dict[str, object]:
        return {**self.incident.to_json(), "findings": [f.to_json() for f in self.findings]}


# -------------------------------------------------------------------------------------- conversions


def _at(now: float) -> datetime:
    return datetime.fromtimestamp(now, tz=UTC)


def _utc(value: datetime) -> datetime:
    """A database timestamp as aware UTC (SQLite hands back naive values)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _utc_or_none(value: datetime | None) -> datetime | None:
    return _utc(value) if value is not None else None


def _json_default(value: object) -> object:
    """orjson fallback: numbers of other libraries (numpy scalars) as floats, anything else as text."""
    if isinstance(value, SupportsFloat):
        return float(value)
    return str(value)


def _dumps(value: object) -> str:
    """JSON text; NaN and infinities become null."""
    return orjson.dumps(value, default=_json_default).decode()


def _loads_lenient(text: str | None) -> object:
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _evidence(text: str) -> dict[str, EvidenceValue]:
    parsed = orjson.loads(text)
    return parsed if isinstance(parsed, dict) else {}


def _severity(label: str) -> Severity:
    try:
        return Severity[label.upper()]
    except KeyError:
        return Severity.UNKNOWN


def _finite_or_none(value: float | None) -> float | None:
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _encode_values(values: Mapping[str, float]) -> StepValues:
    return {key: _finite_or_none(value) for key, value in values.items()}


def _pack(values: StepValues) -> bytes:
    return orjson.dumps(values)


def _unpack(blob: bytes) -> StepValues:
    raw = orjson.loads(blob)
    return {key: (float(value) if value is not None else None) for key, value in raw.items()}


def _chunks(items: Sequence[int], size: int) -> Iterator[Sequence[int]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _run_view(row: Run) -> RunView:
    return RunView(
        id=row.id,
        name=row.name,
        created_at=_utc(row.created_at),
        metrics_path=row.metrics_path,
        rollouts_dir=row.rollouts_dir,
        checkpoints_dir=row.checkpoints_dir,
        mode=row.mode,
        status=row.status,
        config_json=row.config_json,
    )


def _attempt_view(row: Attempt) -> AttemptView:
    return AttemptView(
        id=row.id,
        run_id=row.run_id,
        number=row.number,
        started_at=_utc(row.started_at),
        ended_at=_utc_or_none(row.ended_at),
        command=_loads_lenient(row.command_json),
        metrics_path=row.metrics_path,
        pid=row.pid,
        exit_code=row.exit_code,
    )


def _checkpoint_view(row: Checkpoint) -> CheckpointView:
    return CheckpointView(
        id=row.id,
        run_id=row.run_id,
        step=row.step,
        path=row.path,
        found_at=_utc(row.found_at),
        verdict=row.verdict,
        note=row.note,
    )


def _finding_view(row: FindingRow) -> FindingView:
    return FindingView(
        id=row.id,
        run_id=row.run_id,
        attempt_id=row.attempt_id,
        check=row.check,
        severity=_severity(row.severity),
        step=row.step,
        onset_step=row.onset_step,
        message=row.message,
        evidence=_evidence(row.evidence_json),
        created_at=_utc(row.created_at),
        incident_id=row.incident_id,
    )


def _incident_view(row: Incident) -> IncidentView:
    return IncidentView(
        id=row.id,
        run_id=row.run_id,
        check=row.check,
        severity=_severity(row.severity),
        status=row.status,
        opened_at=_utc(row.opened_at),
        opened_step=row.opened_step,
        onset_step=row.onset_step,
        updated_at=_utc(row.updated_at),
        closed_at=_utc_or_none(row.closed_at),
        closed_step=row.closed_step,
        message=row.message,
        evidence=_evidence(row.evidence_json),
        note=row.note,
    )


# --------------------------------------------------------------------------------- engine and schema


def _alembic_config(url: URL | None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    if url is not None:
        # configparser interpolates '%', so a percent-encoded password must be escaped
        config.set_main_option("sqlalchemy.url", url.render_as_string(hide_password=False).replace("%", "%%"))
    return config


def _sqlite_on_connect(dbapi_connection: sqlite3.Connection, _record: object) -> None:
    # SQLAlchemy emits BEGIN itself (see _sqlite_on_begin); pysqlite's own handling would not.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        for pragma in _SQLITE_PRAGMAS:
            cursor.execute(pragma)
    finally:
        cursor.close()


def _sqlite_on_begin(connection: Connection) -> None:
    writes = bool(connection.get_execution_options().get(_WRITE_OPTION))
    connection.exec_driver_sql("BEGIN IMMEDIATE" if writes else "BEGIN")


def _sqlite_engine(url: URL) -> Engine:
    database = url.database or ""
    in_memory = database in ("", ":memory:") or "mode=memory" in database
    if in_memory:
        engine = create_engine(url, poolclass=StaticPool, connect_args={"check_same_thread": False})
    else:
        if not database.startswith("file:"):
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url)
    event.listen(engine, "connect", _sqlite_on_connect)
    event.listen(engine, "begin", _sqlite_on_begin)
    return engine


def _reason(exc: BaseException, url: URL | None) -> str:
    """The first line of an error, with the password scrubbed should a driver echo it."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    if url is not None and url.password:
        text = text.replace(str(url.password), "***")
    return _PASSWORD_IN_URL.sub(r"\1***@", text)


# ------------------------------------------------------------------------------------------- store


class Store:
    """The guardian's history: runs, attempts, steps, checkpoints, findings, incidents.

    Build one with ``Store.open(url)``; use it as a context manager or call ``close()``.
    """

    def __init__(self, engine: Engine, masked_url: str) -> None:
        self._engine = engine
        self._url = masked_url
        writer = engine.execution_options(**{_WRITE_OPTION: True})
        self._read: sessionmaker[Session] = sessionmaker(engine)
        self._write: sessionmaker[Session] = sessionmaker(writer)

    # ----------------------------------------------------------------------------------- lifecycle

    @classmethod
    def open(cls, url: str) -> Store:
        """Connect to ``url``, bring the schema to the newest revision, and return the store.

        Raises ``StoreError`` (URL shown with its password masked) when the URL is invalid, its driver
        is missing, the database cannot be reached or created, or the migration fails.
        """
        masked = mask_url(url)
        parsed: URL | None = None
        engine: Engine | None = None
        try:
            parsed = make_url(url)
            if parsed.get_backend_name() == "sqlite":
                engine = _sqlite_engine(parsed)
            else:
                engine = create_engine(parsed, pool_pre_ping=True)
            _upgrade(engine, parsed)
        except (SQLAlchemyError, CommandError, OSError, ImportError, ValueError) as exc:
            if engine is not None:
                engine.dispose()
            raise StoreError(f"cannot open store at {masked}: {_reason(exc, parsed)}") from None
        return cls(engine, masked)

    def close(self) -> None:
        """Release every pooled connection."""
        self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def url(self) -> str:
        """The database URL, password masked."""
        return self._url

    def schema_version(self) -> str:
        """The schema revision the database is at."""
        with self._engine.connect() as connection:
            revision = MigrationContext.configure(connection).get_current_revision()
        if revision is None:
            raise StoreError(f"store at {self._url} has no schema revision")
        return revision

    # -------------------------------------------------------------------------------- runs, attempts

    def ensure_run(
        self,
        run_id: str,
        *,
        name: str,
        metrics_path: str,
        rollouts_dir: str,
        checkpoints_dir: str | None,
        mode: str,
        now: float,
        config_json: str | None = None,
    ) -> RunView:
        """The run ``run_id``, created with these fields if it does not exist (an existing run is
        returned unchanged)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {sorted(MODES)}, not {mode!r}")
        with self._write() as session, session.begin():
            row = session.get(Run, run_id)
            if row is None:
                row = Run(
                    id=run_id,
                    name=name,
                    created_at=_at(now),
                    metrics_path=metrics_path,
                    rollouts_dir=rollouts_dir,
                    checkpoints_dir=checkpoints_dir,
                    mode=mode,
                    status=RUN_STATUS_ACTIVE,
                    config_json=config_json,
                )
                session.add(row)
                session.flush()
            return _run_view(row)

    def get_run(self, run_id: str) -> RunView | None:
        with self._read() as session:
            row = session.get(Run, run_id)
            return _run_view(row) if row is not None else None

    def set_run_status(self, run_id: str, status: str) -> RunView:
        with self._write() as session, session.begin():
            row = session.get(Run, run_id)
            if row is None:
                raise NotFoundError(f"no run {run_id!r}")
            row.status = status
            return _run_view(row)

    def list_runs(self) -> list[RunView]:
        """All runs, newest first."""
        with self._read() as session:
            rows = session.scalars(select(Run).order_by(Run.created_at.desc(), Run.id))
            return [_run_view(row) for row in rows]

    def start_attempt(
        self,
        run_id: str,
        *,
        metrics_path: str,
        now: float,
        command: Sequence[str] | Mapping[str, object] | None = None,
        pid: int | None = None,
    ) -> AttemptView:
        """Record a new launch of the trainer; its number is one more than the run's last."""
        with self._write() as session, session.begin():
            if session.get(Run, run_id) is None:
                raise NotFoundError(f"no run {run_id!r}")
            last = session.scalar(select(func.max(Attempt.number)).where(Attempt.run_id == run_id))
            row = Attempt(
                run_id=run_id,
                number=(last or 0) + 1,
                started_at=_at(now),
                command_json=_dumps(command) if command is not None else None,
                metrics_path=metrics_path,
                pid=pid,
            )
            session.add(row)
            session.flush()
            return _attempt_view(row)

    def end_attempt(self, attempt_id: int, *, exit_code: int | None, now: float) -> AttemptView:
        """Record that an attempt's trainer exited."""
        with self._write() as session, session.begin():
            row = session.get(Attempt, attempt_id)
            if row is None:
                raise NotFoundError(f"no attempt {attempt_id}")
            row.exit_code = exit_code
            row.ended_at = _at(now)
            return _attempt_view(row)

    def latest_attempt(self, run_id: str) -> AttemptView | None:
        with self._read() as session:
            row = session.scalars(
                select(Attempt).where(Attempt.run_id == run_id).order_by(Attempt.number.desc()).limit(1)
            ).first()
            return _attempt_view(row) if row is not None else None

    # ------------------------------------------------------------------------------------------ steps

    def write_steps(
        self,
        run_id: str,
        attempt_id: int,
        branch: int,
        records: Sequence[StepRecord],
        now: float,
    ) -> None:
        """Store metric records in one transaction: new steps are inserted in bulk; a step already
        stored for (attempt, branch) gets the new values merged in (later values win)."""
        merged: dict[int, StepValues] = {}
        for record in records:
            merged.setdefault(record.step, {}).update(_encode_values(record.data))
        if merged:
            self._upsert_steps(run_id, attempt_id, branch, merged, now)

    def merge_step_values(
        self,
        run_id: str,
        attempt_id: int,
        branch: int,
        step: int,
        values: Mapping[str, float],
        now: float,
    ) -> None:
        """Merge values computed elsewhere (rollout statistics) into a step, creating it if absent."""
        self._upsert_steps(run_id, attempt_id, branch, {step: _encode_values(values)}, now)

    def _upsert_steps(
        self, run_id: str, attempt_id: int, branch: int, merged: Mapping[int, StepValues], now: float
    ) -> None:
        with self._write() as session, session.begin():
            existing: dict[int, tuple[int, bytes]] = {}
            for chunk in _chunks(list(merged), _IN_CHUNK):
                rows = session.execute(
                    select(Step.id, Step.step, Step.metrics).where(
                        Step.attempt_id == attempt_id, Step.branch == branch, Step.step.in_(chunk)
                    )
                )
                for row_id, step, blob in rows:
                    existing[step] = (row_id, blob)
            recorded_at = _at(now)
            inserts: list[dict[str, object]] = []
            updates: list[dict[str, object]] = []
            for step, values in merged.items():
                if step in existing:
                    row_id, blob = existing[step]
                    stored = _unpack(blob)
                    stored.update(values)
                    updates.append({"id": row_id, "metrics": _pack(stored)})
                else:
                    inserts.append(
                        {
                            "run_id": run_id,
                            "attempt_id": attempt_id,
                            "branch": branch,
                            "step": step,
                            "recorded_at": recorded_at,
                            "metrics": _pack(values),
                        }
                    )
            if inserts:
                session.execute(insert(Step), inserts)
            if updates:
                session.execute(update(Step), updates)

    @staticmethod
    def _active_steps(session: Session, run_id: str) -> dict[int, int]:
        """Row id → step for the run's active timeline (see the module docstring)."""
        rows = session.execute(
            select(Step.id, Step.step, Attempt.number, Step.branch)
            .join(Attempt, Step.attempt_id == Attempt.id)
            .where(Step.run_id == run_id)
        )
        lines: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
        for row_id, step, number, branch in rows:
            lines[(number, branch)].append((row_id, step))
        active: dict[int, int] = {}
        cutoff: int | None = None
        for line in sorted(lines, reverse=True):
            members = lines[line]
            for row_id, step in members:
                if cutoff is None or step < cutoff:
                    active[row_id] = step
            first = min(step for _, step in members)
            cutoff = first if cutoff is None else min(cutoff, first)
        return active

    def step_series(self, run_id: str, keys: Sequence[str]) -> dict[str, list[tuple[int, float | None]]]:
        """Each key's (step, value) pairs along the active timeline, steps ascending; steps without
        the key are left out, a stored non-finite value is None."""
        series: dict[str, list[tuple[int, float | None]]] = {key: [] for key in keys}
        with self._read() as session:
            active = self._active_steps(session, run_id)
            rows = session.execute(
                select(Step.id, Step.step, Step.metrics).where(Step.run_id == run_id).order_by(Step.step)
            )
            for row_id, step, blob in rows:
                if row_id not in active:
                    continue
                values = orjson.loads(blob)
                for key, points in series.items():
                    if key in values:
                        value = values[key]
                        points.append((step, float(value) if value is not None else None))
        return series

    def latest_step(self, run_id: str) -> tuple[int, StepValues] | None:
        """The last step of the active timeline with all its values, or None before the first."""
        with self._read() as session:
            row = session.execute(
                select(Step.step, Step.metrics)
                .join(Attempt, Step.attempt_id == Attempt.id)
                .where(Step.run_id == run_id)
                .order_by(Attempt.number.desc(), Step.branch.desc(), Step.step.desc())
                .limit(1)
            ).first()
        if row is None:
            return None
        return row.step, _unpack(row.metrics)

    def count_steps(self, run_id: str) -> int:
        """How many steps the active timeline holds."""
        with self._read() as session:
            return len(self._active_steps(session, run_id))

    # ------------------------------------------------------------------------------------ checkpoints

    def record_checkpoint(
        self,
        run_id: str,
        *,
        step: int,
        path: str,
        verdict: str,
        now: float,
        note: str | None = None,
    ) -> CheckpointView:
        """Insert a checkpoint, or update step/verdict (and note, when given) of the one at ``path``."""
        if verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {sorted(VERDICTS)}, not {verdict!r}")
        with self._write() as session, session.begin():
            row = session.scalars(
                select(Checkpoint).where(Checkpoint.run_id == run_id, Checkpoint.path == path)
            ).first()
            if row is None:
                row = Checkpoint(run_id=run_id, step=step, path=path, found_at=_at(now), verdict=verdict, note=note)
                session.add(row)
            else:
                row.step = step
                row.verdict = verdict
                if note is not None:
                    row.note = note
            session.flush()
            return _checkpoint_view(row)

    def checkpoints(self, run_id: str) -> list[CheckpointView]:
        """The run's checkpoints, by step."""
        with self._read() as session:
            rows = session.scalars(
                select(Checkpoint).where(Checkpoint.run_id == run_id).order_by(Checkpoint.step, Checkpoint.id)
            )
            return [_checkpoint_view(row) for row in rows]

    # ------------------------------------------------------------------------------------- findings

    def add_finding(
        self,
        run_id: str,
        attempt_id: int | None,
        finding: Finding,
        now: float,
        incident_id: int | None = None,
    ) -> int:
        """Store a finding; returns its id."""
        with self._write() as session, session.begin():
            row = FindingRow(
                run_id=run_id,
                attempt_id=attempt_id,
                check=finding.check,
                severity=finding.severity.label,
                step=finding.step,
                onset_step=finding.onset_step,
                message=finding.message,
                evidence_json=_dumps(dict(finding.evidence)),
                created_at=_at(now),
                incident_id=incident_id,
            )
            session.add(row)
            session.flush()
            return row.id

    # ------------------------------------------------------------------------------------ incidents

    def open_incident(self, run_id: str, finding: Finding, now: float) -> IncidentView:
        """Open an incident from the finding that triggered it (the finding itself is stored with
        ``add_finding(..., incident_id=...)``)."""
        with self._write() as session, session.begin():
            row = Incident(
                run_id=run_id,
                check=finding.check,
                severity=finding.severity.label,
                status=INCIDENT_OPEN,
                opened_at=_at(now),
                opened_step=finding.step,
                onset_step=finding.onset_step,
                updated_at=_at(now),
                message=finding.message,
                evidence_json=_dumps(dict(finding.evidence)),
            )
            session.add(row)
            session.flush()
            return _incident_view(row)

    def open_incident_for(self, run_id: str, check: str) -> IncidentView | None:
        """The newest incident of ``check`` on the run that is not closed, if any."""
        with self._read() as session:
            row = session.scalars(
                select(Incident)
                .where(
                    Incident.run_id == run_id,
                    Incident.check == check,
                    Incident.status.not_in(CLOSED_INCIDENT_STATUSES),
                )
                .order_by(Incident.id.desc())
                .limit(1)
            ).first()
            return _incident_view(row) if row is not None else None

    def escalate_incident(self, incident_id: int, finding: Finding, now: float) -> IncidentView:
        """Fold a newer finding into an incident: severity rises to the worst seen, message and
        evidence are refreshed, the onset moves earlier if the finding dates it earlier."""
        with self._write() as session, session.begin():
            row = self._incident_row(session, incident_id)
            if finding.severity > _severity(row.severity):
                row.severity = finding.severity.label
            row.message = finding.message
            row.evidence_json = _dumps(dict(finding.evidence))
            if finding.onset_step is not None and (row.onset_step is None or finding.onset_step < row.onset_step):
                row.onset_step = finding.onset_step
            row.updated_at = _at(now)
            return _incident_view(row)

    def set_incident_status(self, incident_id: int, status: str, now: float) -> IncidentView:
        """Move an open incident to another (intervention) state; closing goes through
        ``close_incident``."""
        if status in CLOSED_INCIDENT_STATUSES:
            raise ValueError(f"use close_incident to set the closed status {status!r}")
        with self._write() as session, session.begin():
            row = self._incident_row(session, incident_id)
            row.status = status
            row.updated_at = _at(now)
            return _incident_view(row)

    def close_incident(
        self,
        incident_id: int,
        *,
        status: str,
        now: float,
        step: int | None = None,
        note: str | None = None,
    ) -> IncidentView:
        """Close an incident with one of ``CLOSED_INCIDENT_STATUSES``."""
        if status not in CLOSED_INCIDENT_STATUSES:
            raise ValueError(f"status must be one of {sorted(CLOSED_INCIDENT_STATUSES)}, not {status!r}")
        with self._write() as session, session.begin():
            row = self._incident_row(session, incident_id)
            row.status = status
            row.closed_at = _at(now)
            row.closed_step = step
            row.updated_at = _at(now)
            if note is not None:
                row.note = note
            return _incident_view(row)

    def list_incidents(self, run_id: str | None = None, limit: int = 50) -> list[IncidentView]:
        """Incidents, newest first (of one run, or of all)."""
        query = select(Incident).order_by(Incident.opened_at.desc(), Incident.id.desc()).limit(limit)
        if run_id is not None:
            query = query.where(Incident.run_id == run_id)
        with self._read() as session:
            return [_incident_view(row) for row in session.scalars(query)]

    def get_incident(self, incident_id: int) -> IncidentDetail | None:
        """An incident with its findings, or None."""
        with self._read() as session:
            row = session.get(Incident, incident_id)
            if row is None:
                return None
            findings = session.scalars(
                select(FindingRow)
                .where(FindingRow.incident_id == incident_id)
                .order_by(FindingRow.created_at, FindingRow.id)
            )
            return IncidentDetail(_incident_view(row), tuple(_finding_view(f) for f in findings))

    @staticmethod
    def _incident_row(session: Session, incident_id: int) -> Incident:
        row = session.get(Incident, incident_id)
        if row is None:
            raise NotFoundError(f"no incident {incident_id}")
        return row


def _upgrade(engine: Engine, url: URL) -> None:
    """``alembic upgrade head`` inside one write transaction on the store's own connection."""
    config = _alembic_config(url)
    with engine.connect() as connection:
        connection.execution_options(**{_WRITE_OPTION: True})
        with connection.begin():
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
