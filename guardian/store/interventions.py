"""The persisted intervention state machine: rows, their event timeline, and the views of both.

``Store`` inherits these methods. ``advance`` commits a new state (and the facts that go with it:
target checkpoint, patch plan, new attempt) in one transaction *before* the caller performs the side
effect that state announces, which is what lets a restarted guardian finish an interrupted
intervention exactly once. States are plain strings here; ``guardian.policy`` owns their meaning.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

import orjson
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from guardian.store.errors import NotFoundError
from guardian.store.models import Intervention, InterventionEvent
from guardian.store.views import as_utc, at_utc

# states after which an intervention is over (a relapse ends it and starts the next one)
FINISHED_STATES = frozenset({"RESOLVED", "UNRESOLVED", "RELAPSED", "GAVE_UP"})


@dataclass(frozen=True, slots=True)
class InterventionEventView:
    id: int
    state: str
    at: datetime
    detail: Mapping[str, object]

    def to_json(self) -> dict[str, object]:
        return {"state": self.state, "at": self.at.isoformat(), "detail": dict(self.detail)}


@dataclass(frozen=True, slots=True)
class InterventionView:
    id: int
    run_id: str
    incident_id: int
    number: int
    kind: str  # remediate | restart
    rung: int
    state: str
    from_attempt_id: int | None
    to_attempt_id: int | None
    target_step: int | None
    target_path: str | None
    plan: Mapping[str, object] | None
    created_at: datetime
    updated_at: datetime
    note: str | None

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES

    @property
    def name(self) -> str:
        """How people read it everywhere (terminal, notifications, incidents show): its run-wide number and its
        incident, never the row id."""
        return f"intervention {self.number} of incident #{self.incident_id}"

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "run_id": self.run_id,
            "incident_id": self.incident_id,
            "number": self.number,
            "kind": self.kind,
            "rung": self.rung,
            "state": self.state,
            "from_attempt_id": self.from_attempt_id,
            "to_attempt_id": self.to_attempt_id,
            "target_step": self.target_step,
            "target_path": self.target_path,
            "plan": dict(self.plan) if self.plan is not None else None,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
            "note": self.note,
        }


def _view(row: Intervention) -> InterventionView:
    return InterventionView(
        id=row.id,
        run_id=row.run_id,
        incident_id=row.incident_id,
        number=row.number,
        kind=row.kind,
        rung=row.rung,
        state=row.state,
        from_attempt_id=row.from_attempt_id,
        to_attempt_id=row.to_attempt_id,
        target_step=row.target_step,
        target_path=row.target_path,
        plan=orjson.loads(row.plan_json) if row.plan_json else None,
        created_at=as_utc(row.created_at),
        updated_at=as_utc(row.updated_at),
        note=row.note,
    )


def _event_view(row: InterventionEvent) -> InterventionEventView:
    return InterventionEventView(row.id, row.state, as_utc(row.at), orjson.loads(row.detail_json))


_UNSET = object()


class InterventionRecords:
    """Intervention methods of ``Store`` (needs the store's read and write session factories)."""

    _read: sessionmaker[Session]
    _write: sessionmaker[Session]

    def create_intervention(
        self, run_id: str, incident_id: int, *, kind: str, rung: int, from_attempt_id: int | None, now: float
    ) -> InterventionView:
        """A new intervention in state DETECTED, numbered after the run's previous ones."""
        with self._write() as session, session.begin():
            number = session.scalar(select(func.max(Intervention.number)).where(Intervention.run_id == run_id))
            row = Intervention(
                run_id=run_id,
                incident_id=incident_id,
                number=(number or 0) + 1,
                kind=kind,
                rung=rung,
                state="DETECTED",
                from_attempt_id=from_attempt_id,
                created_at=at_utc(now),
                updated_at=at_utc(now),
            )
            session.add(row)
            session.flush()
            session.add(InterventionEvent(intervention_id=row.id, state="DETECTED", at=at_utc(now), detail_json="{}"))
            return _view(row)

    def advance(
        self,
        intervention_id: int,
        state: str,
        *,
        now: float,
        detail: Mapping[str, object] | None = None,
        target_step: int | object | None = _UNSET,
        target_path: str | object | None = _UNSET,
        plan: Mapping[str, object] | object | None = _UNSET,
        to_attempt_id: int | object | None = _UNSET,
        note: str | object | None = _UNSET,
    ) -> InterventionView:
        """Commit ``state`` (and any given fields) with an event, in one transaction."""
        with self._write() as session, session.begin():
            row = session.get(Intervention, intervention_id)
            if row is None:
                raise NotFoundError(f"no intervention #{intervention_id}")
            row.state = state
            row.updated_at = at_utc(now)
            if target_step is not _UNSET:
                row.target_step = target_step  # type: ignore[assignment]
            if target_path is not _UNSET:
                row.target_path = target_path  # type: ignore[assignment]
            if plan is not _UNSET:
                row.plan_json = orjson.dumps(plan).decode() if plan is not None else None
            if to_attempt_id is not _UNSET:
                row.to_attempt_id = to_attempt_id  # type: ignore[assignment]
            if note is not _UNSET:
                row.note = note  # type: ignore[assignment]
            session.add(
                InterventionEvent(
                    intervention_id=row.id,
                    state=state,
                    at=at_utc(now),
                    detail_json=orjson.dumps(dict(detail or {}), default=str).decode(),
                )
            )
            session.flush()
            return _view(row)

    def active_intervention(self, run_id: str) -> InterventionView | None:
        """The run's unfinished intervention, if any (at most one runs at a time)."""
        with self._read() as session:
            row = session.scalars(
                select(Intervention)
                .where(Intervention.run_id == run_id, Intervention.state.not_in(FINISHED_STATES))
                .order_by(Intervention.number.desc())
            ).first()
            return _view(row) if row is not None else None

    def interventions(self, run_id: str | None = None, incident_id: int | None = None) -> list[InterventionView]:
        """Interventions, oldest first, of a run and/or an incident."""
        query = select(Intervention).order_by(Intervention.id)
        if run_id is not None:
            query = query.where(Intervention.run_id == run_id)
        if incident_id is not None:
            query = query.where(Intervention.incident_id == incident_id)
        with self._read() as session:
            return [_view(row) for row in session.scalars(query)]

    def run_timelines(self, run_id: str) -> dict[int, list[InterventionEventView]]:
        """Every intervention event of a run in one query, by intervention id, oldest first."""
        timelines: dict[int, list[InterventionEventView]] = {}
        with self._read() as session:
            rows = session.execute(
                select(InterventionEvent)
                .join(Intervention, Intervention.id == InterventionEvent.intervention_id)
                .where(Intervention.run_id == run_id)
                .order_by(InterventionEvent.id)
            ).scalars()
            for r in rows:
                timelines.setdefault(r.intervention_id, []).append(_event_view(r))
        return timelines

    def intervention_events(self, intervention_id: int) -> list[InterventionEventView]:
        with self._read() as session:
            rows = session.scalars(
                select(InterventionEvent)
                .where(InterventionEvent.intervention_id == intervention_id)
                .order_by(InterventionEvent.id)
            )
            return [_event_view(r) for r in rows]
