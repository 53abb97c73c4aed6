"""The persisted intervention state machine: rows, their event timeline, and the typed views of both.

``Store`` inherits these methods. ``advance`` commits a new state and its facts in one transaction *before* the
caller's side effect, so a restarted guardian finishes an intervention exactly once; ``guardian.rescue.policy``
owns the transitions. One writer (``rescue.executor``), several readers (``StoredPlan``, ``StateDetail``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple, TypedDict

import orjson
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from guardian.states import FINISHED_STATES, Kind, State
from guardian.store.errors import NotFoundError
from guardian.store.models import Intervention, InterventionEvent
from guardian.store.views import as_utc, at_utc


class ConfigChange(NamedTuple):
    """One setting a patch changed: its Hydra key, the effective value before and the value after."""

    key: str
    before: object
    after: object

    def to_json(self) -> dict[str, object]:
        return {"key": self.key, "before": self.before, "after": self.after}


def config_changes(value: object) -> tuple[ConfigChange, ...]:
    """A stored diff as ``ConfigChange`` rows: ``{"key", "before", "after"}`` objects (what is written now) or
    ``[key, before, after]`` lists (what older guardians wrote into a PATCHED event)."""
    rows: list[ConfigChange] = []
    for item in value if isinstance(value, list | tuple) else ():
        if isinstance(item, Mapping) and "key" in item:
            rows.append(ConfigChange(str(item["key"]), item.get("before"), item.get("after")))
        elif isinstance(item, list | tuple) and len(item) == 3:
            rows.append(ConfigChange(str(item[0]), item[1], item[2]))
    return tuple(rows)


@dataclass(frozen=True, slots=True)
class StoredPlan:
    """The relaunch an intervention committed in PATCHED: what RESUMING launches, and what people read of it."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)  # added to the trainer's environment
    diff: tuple[ConfigChange, ...] = ()
    notes: tuple[str, ...] = ()
    resume_from: str | None = None  # the checkpoint folder; None: from scratch
    resume_path: str | None = None  # as verl is given it (trainer.resume_from_path)
    rung: str | None = None  # the remedy's name; None for a restart
    optimizer_reset: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "argv": list(self.argv),
            "env": dict(self.env),
            "diff": [c.to_json() for c in self.diff],
            "notes": list(self.notes),
            "resume_from": self.resume_from,
            "resume_path": self.resume_path,
            "rung": self.rung,
            "optimizer_reset": self.optimizer_reset,
        }

    @classmethod
    def from_json(cls, document: Mapping[str, object]) -> StoredPlan:
        """Read a stored plan; a missing or mistyped field reads as empty (rows of older guardians)."""
        argv, env, notes = document.get("argv"), document.get("env"), document.get("notes")
        resume_from, resume_path, rung = document.get("resume_from"), document.get("resume_path"), document.get("rung")
        return cls(
            argv=tuple(str(a) for a in argv) if isinstance(argv, list | tuple) else (),
            env={str(k): str(v) for k, v in env.items()} if isinstance(env, Mapping) else {},
            diff=config_changes(document.get("diff")),
            notes=tuple(str(n) for n in notes) if isinstance(notes, list | tuple) else (),
            resume_from=str(resume_from) if resume_from is not None else None,
            resume_path=str(resume_path) if resume_path is not None else None,
            rung=str(rung) if rung is not None else None,
            optimizer_reset=document.get("optimizer_reset") is True,
        )


class StateDetail(TypedDict, total=False):
    """What an intervention's event may say, by the state that writes it."""

    why: str  # STOPPED (the target's rule), ROLLED_BACK from scratch, the endings: the reason
    plan: str  # STOPPING: the ladder's decision (rung, relapses)
    exclude_steps: list[int]  # STOPPING: earlier targets of the same incident
    target: str | None  # STOPPED: the rollback checkpoint's path; ROLLED_BACK: None from scratch
    moved: list[int]  # ROLLED_BACK: the checkpoint steps moved to quarantine
    tracker: int  # ROLLED_BACK: the step latest_checkpointed_iteration.txt was rewritten to
    restored_from: str  # ROLLED_BACK: the pinned copy the target was restored from (verl's retention emptied it)
    restore_mode: str  # ROLLED_BACK: how (PinMode: link or copy)
    dumps_quarantined: list[int]  # ROLLED_BACK: the steps of the abandoned branch's rollout dumps, moved aside
    dumps_kept: bool  # ROLLED_BACK: False when moving them failed
    diff: list[dict[str, object]]  # PATCHED: ConfigChange.to_json rows
    notes: list[str]  # PATCHED
    first_step: int  # PROBATION: the relaunched trainer's first new step
    outcome: dict[str, object]  # the endings: outcome.Outcome.to_json


@dataclass(frozen=True, slots=True)
class InterventionEventView:
    id: int
    state: State
    at: datetime
    detail: StateDetail

    def to_json(self) -> dict[str, object]:
        return {"state": self.state, "at": self.at.isoformat(), "detail": dict(self.detail)}


@dataclass(frozen=True, slots=True)
class InterventionView:
    id: int
    run_id: str
    incident_id: int
    number: int
    kind: Kind
    rung: int
    state: State
    from_attempt_id: int | None
    to_attempt_id: int | None
    target_step: int | None
    target_path: str | None
    plan: StoredPlan | None
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
            "plan": self.plan.to_json() if self.plan is not None else None,
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
        kind=Kind(row.kind),
        rung=row.rung,
        state=State(row.state),
        from_attempt_id=row.from_attempt_id,
        to_attempt_id=row.to_attempt_id,
        target_step=row.target_step,
        target_path=row.target_path,
        plan=StoredPlan.from_json(orjson.loads(row.plan_json)) if row.plan_json else None,
        created_at=as_utc(row.created_at),
        updated_at=as_utc(row.updated_at),
        note=row.note,
    )


def _event_view(row: InterventionEvent) -> InterventionEventView:
    detail: StateDetail = orjson.loads(row.detail_json)
    return InterventionEventView(row.id, State(row.state), as_utc(row.at), detail)


_UNSET = object()


class InterventionRecords:
    """Intervention methods of ``Store`` (needs the store's read and write session factories)."""

    _read: sessionmaker[Session]
    _write: sessionmaker[Session]

    def create_intervention(
        self, run_id: str, incident_id: int, *, kind: Kind, rung: int, from_attempt_id: int | None, now: float
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
                state=State.DETECTED,
                from_attempt_id=from_attempt_id,
                created_at=at_utc(now),
                updated_at=at_utc(now),
            )
            session.add(row)
            session.flush()
            session.add(
                InterventionEvent(intervention_id=row.id, state=State.DETECTED, at=at_utc(now), detail_json="{}")
            )
            return _view(row)

    def advance(
        self,
        intervention_id: int,
        state: State,
        *,
        now: float,
        detail: StateDetail | None = None,
        target_step: int | object | None = _UNSET,
        target_path: str | object | None = _UNSET,
        plan: StoredPlan | object | None = _UNSET,
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
                row.plan_json = None if plan is None else orjson.dumps(plan.to_json()).decode()  # type: ignore[attr-defined]
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
