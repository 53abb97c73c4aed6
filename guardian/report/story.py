"""What happened, from the stored incidents and interventions: markers, timeline, patches and the steps an
incident's plots span. Pure. Labels carry a number only where the report holds more than one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from guardian.notify.compose import format_setting
from guardian.report.series import Marker, MarkerKind, StepRange
from guardian.rescue.outcome import outcome_line
from guardian.states import IncidentStatus, State
from guardian.store import ConfigChange, IncidentDetail, InterventionEventView, InterventionView, config_changes

Timeline = Sequence[InterventionEventView]
Intervened = Sequence[tuple[InterventionView, Timeline]]


@dataclass(frozen=True, slots=True)
class TimelineRow:
    """One thing that happened, in time order: a finding, an intervention's state, the incident's closing."""

    at: datetime
    step: int | None
    what: str
    detail: str


@dataclass(frozen=True, slots=True)
class Patch:
    """The config change one intervention relaunched with."""

    name: str  # "intervention 1 of incident #1"
    rung: str | None
    changes: tuple[ConfigChange, ...]
    notes: tuple[str, ...]


def resume_step(timeline: Timeline) -> int | None:
    """The relaunched trainer's first new step (PROBATION records it); None before it logged one."""
    for e in timeline:
        first = e.detail.get("first_step") if e.state == State.PROBATION else None
        if isinstance(first, int):
            return first
    return None


def markers(details: Sequence[IncidentDetail], interventions: Intervened) -> tuple[Marker, ...]:
    """Each incident's onset and detection, each intervention's rollback point and resume."""
    several_incidents = len(details) > 1
    several_interventions = len(interventions) > 1
    found: list[Marker] = []
    for detail in details:
        i = detail.incident
        tag = f" #{i.id}" if several_incidents else ""
        if i.onset_step is not None:
            found.append(Marker(i.onset_step, MarkerKind.ONSET, f"onset{tag}"))
        if i.opened_step is not None:
            found.append(Marker(i.opened_step, MarkerKind.DETECTION, f"detected{tag}"))
    for iv, timeline in interventions:
        tag = f" {iv.number}" if several_interventions else ""
        if iv.target_step is not None:
            found.append(Marker(iv.target_step, MarkerKind.ROLLBACK, f"rollback{tag}"))
        resumed = resume_step(timeline)
        if resumed is not None:
            found.append(Marker(resumed, MarkerKind.RESUME, f"resume{tag}"))
    return tuple(found)


def incident_steps(
    detail: IncidentDetail, marked: Sequence[Marker], context: int, logged: StepRange | None
) -> StepRange | None:
    """The steps an incident's plots span: its marked steps and its closing, ``context`` steps either side (an
    incident still open runs to the newest step), within what the run logged."""
    if logged is None:
        return None
    i = detail.incident
    steps = [m.step for m in marked] + ([i.closed_step] if i.closed_step is not None else [])
    if not steps:
        return logged
    lo = max(logged[0], min(steps) - context)
    hi = logged[1] if i.is_open else min(logged[1], max(steps) + context)
    return (lo, hi) if lo <= hi else logged


def _steps(value: object) -> str:
    steps = [str(s) for s in value] if isinstance(value, list) else []
    if len(steps) > 6:
        return f"{len(steps)} (steps {steps[0]}-{steps[-1]})"
    return ", ".join(steps) or "none"


def event_summary(detail: Mapping[str, object]) -> str:
    """An intervention event's detail (``StateDetail``) as one line."""
    parts: list[str] = []
    if detail.get("plan"):
        parts.append(str(detail["plan"]))
    if detail.get("target"):
        parts.append(f"rollback target {detail['target']}")
    if detail.get("why"):
        parts.append(str(detail["why"]))
    if "moved" in detail:
        parts.append(f"quarantined checkpoints: {_steps(detail['moved'])}")
    if detail.get("tracker") is not None:
        parts.append(f"tracker rewritten to step {detail['tracker']}")
    if detail.get("dumps_quarantined"):
        parts.append(f"quarantined rollout dumps: {_steps(detail['dumps_quarantined'])}")
    if detail.get("dumps_kept") is False:
        parts.append("the abandoned branch's rollout dumps could not be moved aside")
    changes = config_changes(detail.get("diff"))
    if changes:
        parts.append("; ".join(f"{c.key}: {format_setting(c.before)} -> {format_setting(c.after)}" for c in changes))
    if isinstance(detail.get("first_step"), int):
        parts.append(f"resumed at step {detail['first_step']}")
    outcome = detail.get("outcome")
    if isinstance(outcome, Mapping):
        parts.append(f"figures: {outcome_line(outcome)}")
    return " - ".join(parts)


def timeline(details: Sequence[IncidentDetail], interventions: Intervened) -> tuple[TimelineRow, ...]:
    """The incidents' openings, later findings and closings, and every intervention event, oldest first."""
    rows: list[TimelineRow] = []
    for detail in details:
        i = detail.incident
        first = detail.findings[0] if detail.findings else None
        said = f"{first.severity.label} {first.check}: {first.message}" if first else f"{i.check}: {i.message}"
        rows.append(TimelineRow(i.opened_at, i.opened_step, f"incident #{i.id} opened", said))
        rows += [  # the oldest finding is the one that opened the incident
            TimelineRow(f.created_at, f.step, f"finding {f.severity.label}", f"{f.check}: {f.message}")
            for f in detail.findings[1:]
        ]
        if i.closed_at is not None:  # a person's close says so; its note is who closed it and why
            how = "closed by hand" if i.status == IncidentStatus.CLOSED else str(i.status)
            rows.append(TimelineRow(i.closed_at, i.closed_step, f"incident #{i.id} {how}", i.note or ""))
    for iv, events in interventions:
        rows += [TimelineRow(e.at, None, f"{iv.name}: {e.state}", event_summary(e.detail)) for e in events]
    return tuple(sorted(rows, key=lambda r: r.at))


def patches(interventions: Intervened) -> tuple[Patch, ...]:
    """The config change of each intervention that committed one (PATCHED), oldest first."""
    found = []
    for iv, events in interventions:
        detail: dict[str, object] = {}
        for e in events:
            if e.state == State.PATCHED:
                detail.update(e.detail)
        changes = (iv.plan.diff if iv.plan else ()) or config_changes(detail.get("diff"))
        stored_notes = detail.get("notes")
        notes = (iv.plan.notes if iv.plan else ()) or (
            tuple(str(n) for n in stored_notes) if isinstance(stored_notes, list) else ()
        )
        if changes or notes:
            found.append(Patch(iv.name, iv.plan.rung if iv.plan else None, changes, notes))
    return tuple(found)
