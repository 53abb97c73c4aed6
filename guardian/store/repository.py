"""The one repository object over the guardian's SQL history.

``Store`` owns the engine and every session; callers get frozen views, never ORM objects. Time is injected
(``now``, epoch seconds). Each (attempt, branch) is a *line* of steps; the *active timeline* takes the newest
line whole and each older line only before the first step of every newer one, as ``history.RunHistory`` does."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from types import TracebackType
from typing import Final, Self, SupportsFloat, TypeVar

import orjson
from sqlalchemy import Connection, Engine, func, insert, select, text, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from guardian.config import BUSY_TIMEOUT_S, MIGRATION_WAIT_S, STATEMENT_TIMEOUT_S
from guardian.core import Finding, StepRecord
from guardian.ids import MAX_RUN_ID
from guardian.states import CLOSED_INCIDENT_STATUSES, IncidentStatus, RunStatus
from guardian.store.changes import WriteCount
from guardian.store.deliveries import DeliveryRecords
from guardian.store.engine import (
    STEPS_ONLY_OPTION,
    WRITE_OPTION,
    current_revision,
    is_locked,
    mask_url,
    open_engine,
    when_free,
)
from guardian.store.errors import NotFoundError, StoreError
from guardian.store.evaluations import EvaluationRecords
from guardian.store.interventions import InterventionRecords
from guardian.store.models import Attempt, Checkpoint, FindingRow, Incident, Run, Step, path_key
from guardian.store.pins import PinRecords
from guardian.store.views import (
    MODES,
    VERDICTS,
    AttemptView,
    CheckpointView,
    IncidentDetail,
    IncidentView,
    RunView,
    StepIndex,
    StepLine,
    at_utc,
    attempt_view,
    checkpoint_view,
    finding_view,
    incident_view,
    parse_severity,
    run_view,
)

_IN_CHUNK: Final = 500
# a run's registration (and its first attempt) waits this long for a store other writers keep locked (SQLite): the
# runs of a fleet start together, and SQLite's busy handler can pass one writer over for longer than the busy timeout
REGISTER_WAIT_S: Final = MIGRATION_WAIT_S
_T = TypeVar("_T")

StepValues = dict[str, float | None]

# ------------------------------------------------------------------------------------------ helpers


def _json_default(value: object) -> object:
    """orjson fallback: numbers of other libraries (numpy scalars) as floats, anything else as text."""
    if isinstance(value, SupportsFloat):
        return float(value)
    return str(value)


def _dumps(value: object) -> str:
    """JSON text; NaN and infinities become null."""
    return orjson.dumps(value, default=_json_default).decode()


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


# ------------------------------------------------------------------------------------------- store


class Store(InterventionRecords, DeliveryRecords, EvaluationRecords, PinRecords):
    """The guardian's history: runs, attempts, steps, checkpoints, pins, findings, incidents, interventions,
    deliveries, evaluations.

    Build one with ``Store.open(url)``; use it as a context manager or call ``close()``.
    """

    def __init__(
        self, engine: Engine, masked_url: str, connection: Connection | None = None, writes: WriteCount | None = None
    ) -> None:
        self._engine = engine
        self._url = masked_url
        # this process's committed writes on the engine (``changes.StoreMemo`` keeps reads while it stands still)
        self.writes = writes if writes is not None else WriteCount.on(engine)
        self._joined = connection is not None  # inside ``transaction``: the caller's transaction, never retried here
        if connection is not None:  # every session joins the connection's transaction (see ``transaction``)
            self._read: sessionmaker[Session] = sessionmaker(connection)
            self._write: sessionmaker[Session] = self._read
        else:
            self._read = sessionmaker(engine)
            self._write = sessionmaker(engine.execution_options(**{WRITE_OPTION: True}))

    # ----------------------------------------------------------------------------------- lifecycle

    @classmethod
    def open(
        cls, url: str, *, busy_timeout_s: float = BUSY_TIMEOUT_S, statement_timeout_s: float = STATEMENT_TIMEOUT_S
    ) -> Store:
        """Connect to ``url`` (SQLite or PostgreSQL), bring the schema to the newest revision, and return the store
        (a write waits up to ``busy_timeout_s`` for another connection's lock, then fails; on PostgreSQL a round trip
        the server does not answer within ``statement_timeout_s`` fails as an outage).

        Raises ``StoreError`` (URL shown with its password masked) when the URL is invalid, its driver
        is missing, the database cannot be reached or created, or the migration fails.
        """
        engine = open_engine(url, busy_timeout_s=busy_timeout_s, statement_timeout_s=statement_timeout_s)
        return cls(engine, mask_url(url))

    @contextmanager
    def transaction(self, *, steps_only: bool = False) -> Iterator[Store]:
        """One write transaction around several calls: the yielded store's methods all run in it, and it
        commits when the block ends (nothing of it is kept if the block or the commit fails). ``steps_only``: it
        writes step rows alone (the memos of ``changes`` keep their reads over it)."""
        with self._engine.connect() as connection:
            connection.execution_options(**{WRITE_OPTION: True, STEPS_ONLY_OPTION: steps_only})
            with connection.begin():
                yield Store(self._engine, self._url, connection, self.writes)

    def probe_write(self) -> None:
        """A real write that changes nothing (the schema revision row rewritten as it is): raises the
        database's error while the store refuses writes (locked, full, damaged, unreachable)."""
        with self._write() as session, session.begin():
            session.execute(text("UPDATE alembic_version SET version_num = version_num"))

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
        revision = current_revision(self._engine)
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
        if not 1 <= len(run_id) <= MAX_RUN_ID:
            raise ValueError(
                f"run id of {len(run_id)} characters: the store keeps ids of 1-{MAX_RUN_ID} "
                "(guardian.ids.checked_run_id is the rule the command line applies)"
            )
        return self._registering(
            run_id,
            "register it",
            lambda: self._ensure_run(
                run_id,
                name=name,
                metrics_path=metrics_path,
                rollouts_dir=rollouts_dir,
                checkpoints_dir=checkpoints_dir,
                mode=mode,
                now=now,
                config_json=config_json,
            ),
        )

    def _registering(self, run_id: str, what: str, work: Callable[[], _T]) -> _T:
        """``work`` (one write transaction of a run's start), waiting up to ``REGISTER_WAIT_S`` while SQLite refuses
        it as locked by other writers; past that, one ``StoreError`` line that says so (never a driver traceback)."""
        if self._joined:
            return work()
        wait_s = REGISTER_WAIT_S
        try:
            return when_free(work, wait_s)
        except OperationalError as exc:
            if not is_locked(exc):
                raise
            raise StoreError(
                f"run {run_id}: cannot {what}: the store at {self._url} stayed locked by other writers for "
                f"{wait_s:g} s; find the process that holds it (fuser or lsof on the file) and start the run again"
            ) from None

    def _ensure_run(
        self,
        run_id: str,
        *,
        name: str,
        metrics_path: str,
        rollouts_dir: str,
        checkpoints_dir: str | None,
        mode: str,
        now: float,
        config_json: str | None,
    ) -> RunView:
        with self._write() as session, session.begin():
            row = session.get(Run, run_id)
            if row is None:
                row = Run(
                    id=run_id,
                    name=name,
                    created_at=at_utc(now),
                    metrics_path=metrics_path,
                    rollouts_dir=rollouts_dir,
                    checkpoints_dir=checkpoints_dir,
                    mode=mode,
                    status=RunStatus.ACTIVE,
                    config_json=config_json,
                )
                session.add(row)
                session.flush()
            return run_view(row)

    def get_run(self, run_id: str) -> RunView | None:
        with self._read() as session:
            row = session.get(Run, run_id)
            return run_view(row) if row is not None else None

    def set_run_status(self, run_id: str, status: RunStatus) -> RunView:
        if status not in set(RunStatus):
            raise ValueError(f"status must be one of {sorted(RunStatus)}, not {status!r}")
        with self._write() as session, session.begin():
            row = session.get(Run, run_id)
            if row is None:
                raise NotFoundError(f"no run {run_id!r}")
            row.status = status
            return run_view(row)

    def record_run_exit(self, run_id: str, exit_code: int) -> None:
        """Keep the exit code the run's guardian ended with (``exit_code`` in its ``config_json``): a later start of
        the same run, finished or given up, answers with it instead of launching again."""
        with self._write() as session, session.begin():
            _merge_saved(_run_row(session, run_id), {"exit_code": int(exit_code)})

    def record_run_stop(self, run_id: str, stopped: Mapping[str, object]) -> RunView:
        """A person stopped the run (``guardian stop``): it is over (finished: a later start of it answers its end
        instead of launching again) and what stopped it is kept (``stopped`` in its ``config_json``: who, why,
        when, which attempt, the signals sent)."""
        with self._write() as session, session.begin():
            row = _run_row(session, run_id)
            _merge_saved(row, {"stopped": dict(stopped)})
            row.status = RunStatus.FINISHED
            return run_view(row)

    def list_runs(self) -> list[RunView]:
        """All runs, newest first."""
        with self._read() as session:
            rows = session.scalars(select(Run).order_by(Run.created_at.desc(), Run.id))
            return [run_view(row) for row in rows]

    def start_attempt(
        self,
        run_id: str,
        *,
        metrics_path: str,
        now: float,
        command: Sequence[str] | Mapping[str, object] | None = None,
        pid: int | None = None,
        launch: bool = False,
    ) -> AttemptView:
        """Record a new launch of the trainer (or, for ``watch``, a new segment of its file); its number is one more
        than the run's last. The first launch (``launch``) is part of the run's start and waits, as its
        registration does, for a store other writers keep locked; any other refusal is the guard loop's to handle
        (an outage: the tick fails fast and the next one carries its lines)."""

        def work() -> AttemptView:
            return self._start_attempt(run_id, metrics_path=metrics_path, now=now, command=command, pid=pid)

        if self._joined or not launch or self.latest_attempt(run_id) is not None:
            return work()
        return self._registering(run_id, "record its first attempt", work)

    def _start_attempt(
        self,
        run_id: str,
        *,
        metrics_path: str,
        now: float,
        command: Sequence[str] | Mapping[str, object] | None,
        pid: int | None,
    ) -> AttemptView:
        with self._write() as session, session.begin():
            if session.get(Run, run_id) is None:
                raise NotFoundError(f"no run {run_id!r}")
            last = session.scalar(select(func.max(Attempt.number)).where(Attempt.run_id == run_id))
            row = Attempt(
                run_id=run_id,
                number=(last or 0) + 1,
                started_at=at_utc(now),
                command_json=_dumps(command) if command is not None else None,
                metrics_path=metrics_path,
                pid=pid,
            )
            session.add(row)
            session.flush()
            return attempt_view(row)

    def end_attempt(self, attempt_id: int, *, exit_code: int | None, now: float) -> AttemptView:
        """Record that an attempt's trainer exited."""
        with self._write() as session, session.begin():
            row = session.get(Attempt, attempt_id)
            if row is None:
                raise NotFoundError(f"no attempt {attempt_id}")
            row.exit_code = exit_code
            row.ended_at = at_utc(now)
            return attempt_view(row)

    def latest_attempt(self, run_id: str) -> AttemptView | None:
        with self._read() as session:
            row = session.scalars(
                select(Attempt).where(Attempt.run_id == run_id).order_by(Attempt.number.desc()).limit(1)
            ).first()
            return attempt_view(row) if row is not None else None

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
            recorded_at = at_utc(now)
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
    def _line_cutoffs(lines: Mapping[tuple[int, int], Sequence[int]]) -> dict[tuple[int, int], int | None]:
        """Each line's (attempt number, branch) first step taken over by a newer line (None for the newest):
        the module docstring's rule, in one place for the active timeline and for ``step_lines``."""
        cutoffs: dict[tuple[int, int], int | None] = {}
        cutoff: int | None = None
        for line in sorted(lines, reverse=True):
            cutoffs[line] = cutoff
            first = min(lines[line])
            cutoff = first if cutoff is None else min(cutoff, first)
        return cutoffs

    @classmethod
    def _active_steps(cls, session: Session, run_id: str) -> dict[int, int]:
        """Row id → step for the run's active timeline (see the module docstring)."""
        rows = session.execute(
            select(Step.id, Step.step, Attempt.number, Step.branch)
            .join(Attempt, Step.attempt_id == Attempt.id)
            .where(Step.run_id == run_id)
        )
        lines: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
        for row_id, step, number, branch in rows:
            lines[(number, branch)].append((row_id, step))
        cutoffs = cls._line_cutoffs({line: [step for _, step in members] for line, members in lines.items()})
        return {
            row_id: step
            for line, members in lines.items()
            for row_id, step in members
            if (cut := cutoffs[line]) is None or step < cut
        }

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

    def step_lines(self, run_id: str, keys: Collection[str], prefixes: Sequence[str] = ()) -> list[StepLine]:
        """Every line of the run's steps, oldest line first, abandoned lines too, with the values of ``keys`` and
        of the keys starting with one of ``prefixes`` (a long run's every value would not fit in memory): what a
        report draws to show the branch a rollback abandoned beside the one it kept (``step_series`` holds only
        the kept one). A step is there even when it logs none of them; a stored non-finite value is None."""
        wanted = frozenset(keys)
        prefix = tuple(prefixes)
        with self._read() as session:
            rows = session.execute(
                select(Attempt.number, Step.branch, Step.step, Step.metrics)
                .join(Attempt, Step.attempt_id == Attempt.id)
                .where(Step.run_id == run_id)
                .order_by(Attempt.number, Step.branch, Step.step)
            )
            lines: dict[tuple[int, int], list[tuple[int, StepValues]]] = defaultdict(list)
            for number, branch, step, blob in rows:
                values = _unpack(blob)
                kept = {k: v for k, v in values.items() if k in wanted or k.startswith(prefix)}
                lines[(number, branch)].append((step, kept))
        cutoffs = self._line_cutoffs({line: [step for step, _ in steps] for line, steps in lines.items()})
        return [StepLine(*line, cutoffs[line], tuple(steps)) for line, steps in lines.items()]

    def active_records(self, run_id: str) -> list[StepRecord]:
        """The active timeline's steps with all their stored values, ascending (a stored null as NaN): what a
        ``RunHistory`` rebuilt from the store (the launch checklist) reads."""
        with self._read() as session:
            active = self._active_steps(session, run_id)
            rows = session.execute(
                select(Step.id, Step.step, Step.metrics).where(Step.run_id == run_id).order_by(Step.step)
            )
            return [
                StepRecord(step, {k: math.nan if v is None else v for k, v in _unpack(blob).items()})
                for row_id, step, blob in rows
                if row_id in active
            ]

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

    def latest_step_of_attempt(self, attempt_id: int) -> int | None:
        """The newest step stored for one attempt (any branch), or None before its first."""
        with self._read() as session:
            return session.scalar(select(func.max(Step.step)).where(Step.attempt_id == attempt_id))

    def attempts(self, run_id: str) -> list[AttemptView]:
        """The run's attempts, oldest first."""
        with self._read() as session:
            rows = session.scalars(select(Attempt).where(Attempt.run_id == run_id).order_by(Attempt.number))
            return [attempt_view(row) for row in rows]

    def step_index(self, run_id: str) -> list[StepIndex]:
        """Every step stored for the run, abandoned lines too, without values, in line order (attempt number,
        branch, step): what the review reads to tell which steps a rollback threw away."""
        with self._read() as session:
            rows = session.execute(
                select(Step.attempt_id, Attempt.number, Step.branch, Step.step)
                .join(Attempt, Step.attempt_id == Attempt.id)
                .where(Step.run_id == run_id)
                .order_by(Attempt.number, Step.branch, Step.step)
            )
            return [StepIndex(*row) for row in rows]

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
            key = path_key(path)
            row = session.scalars(
                select(Checkpoint).where(Checkpoint.run_id == run_id, Checkpoint.path_key == key)
            ).first()
            if row is None:
                row = Checkpoint(
                    run_id=run_id, step=step, path=path, path_key=key, found_at=at_utc(now), verdict=verdict, note=note
                )
                session.add(row)
            else:
                row.step = step
                row.verdict = verdict
                if note is not None:
                    row.note = note
            session.flush()
            return checkpoint_view(row)

    def checkpoints(self, run_id: str) -> list[CheckpointView]:
        """The run's checkpoints, by step."""
        with self._read() as session:
            rows = session.scalars(
                select(Checkpoint).where(Checkpoint.run_id == run_id).order_by(Checkpoint.step, Checkpoint.id)
            )
            return [checkpoint_view(row) for row in rows]

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
                created_at=at_utc(now),
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
                status=IncidentStatus.OPEN,
                opened_at=at_utc(now),
                opened_step=finding.step,
                onset_step=finding.onset_step,
                updated_at=at_utc(now),
                message=finding.message,
                evidence_json=_dumps(dict(finding.evidence)),
            )
            session.add(row)
            session.flush()
            return incident_view(row)

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
            return incident_view(row) if row is not None else None

    def escalate_incident(self, incident_id: int, finding: Finding, now: float) -> IncidentView:
        """Fold a newer finding into an incident: severity rises to the worst seen, message and
        evidence are refreshed, the onset moves earlier if the finding dates it earlier."""
        with self._write() as session, session.begin():
            row = self._incident_row(session, incident_id)
            if finding.severity > parse_severity(row.severity):
                row.severity = finding.severity.label
            row.message = finding.message
            row.evidence_json = _dumps(dict(finding.evidence))
            if finding.onset_step is not None and (row.onset_step is None or finding.onset_step < row.onset_step):
                row.onset_step = finding.onset_step
            row.updated_at = at_utc(now)
            return incident_view(row)

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
            row.closed_at = at_utc(now)
            row.closed_step = step
            row.updated_at = at_utc(now)
            if note is not None:
                row.note = note
            return incident_view(row)

    def list_incidents(
        self, run_id: str | None = None, limit: int | None = None, since: datetime | None = None
    ) -> list[IncidentView]:
        """Incidents, newest first (of one run, or of all; opened at or after ``since``, timezone-aware); the newest
        ``limit`` of them, or every one for None."""
        query = select(Incident).order_by(Incident.opened_at.desc(), Incident.id.desc()).limit(limit)
        if run_id is not None:
            query = query.where(Incident.run_id == run_id)
        if since is not None:
            query = query.where(Incident.opened_at >= since.astimezone(UTC))
        with self._read() as session:
            return [incident_view(row) for row in session.scalars(query)]

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
            return IncidentDetail(incident_view(row), tuple(finding_view(f) for f in findings))

    @staticmethod
    def _incident_row(session: Session, incident_id: int) -> Incident:
        row = session.get(Incident, incident_id)
        if row is None:
            raise NotFoundError(f"no incident {incident_id}")
        return row


def _run_row(session: Session, run_id: str) -> Run:
    row = session.get(Run, run_id)
    if row is None:
        raise NotFoundError(f"no run {run_id!r}")
    return row


def _merge_saved(row: Run, fields: Mapping[str, object]) -> None:
    """``fields`` merged into what the run keeps of itself (``config_json``: its command, cwd, end...)."""
    saved = orjson.loads(row.config_json or "{}")
    saved = saved if isinstance(saved, dict) else {}
    row.config_json = orjson.dumps({**saved, **fields}, default=_json_default).decode()
