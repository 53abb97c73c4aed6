"""The events people are told about, derived from the store: the outbox the dispatcher delivers.

Each ``GuardianEvent`` has a stable key, so a restarted guardian neither loses nor repeats one:
``incident:<id>:<severity>`` (opened or escalated), ``incident:<id>:closed``, ``intervention:<event id>``
(one of ``NOTIFIED_STATES``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import IntEnum, StrEnum
from typing import TYPE_CHECKING, Final

from guardian.core import Severity
from guardian.states import State

if TYPE_CHECKING:
    from guardian.store import IncidentView, Store
    from guardian.store.interventions import InterventionEventView, InterventionView


class Level(IntEnum):
    """How loud an event is; notifiers route on it (``min_level``)."""

    INFO = 0
    WARNING = 1
    CRITICAL = 2

    @property
    def label(self) -> str:
        return self.name.lower()


class EventKind(StrEnum):
    INCIDENT = "incident"  # opened, or escalated to a higher severity
    INCIDENT_CLOSED = "incident_closed"
    INTERVENTION = "intervention"  # an intervention entered a notified state


# DETECTED repeats the incident, STOPPING and PROBATION are transient: the rest is what people act on
NOTIFIED_STATES: Final[Mapping[State, Level]] = {
    State.STOPPED: Level.INFO,
    State.ROLLED_BACK: Level.INFO,
    State.PATCHED: Level.INFO,
    State.RESUMING: Level.INFO,
    State.RESOLVED: Level.INFO,
    State.UNRESOLVED: Level.CRITICAL,
    State.RELAPSED: Level.WARNING,
    State.GAVE_UP: Level.CRITICAL,
}
_INCIDENT_LEVEL: Final[Mapping[Severity, Level]] = {Severity.WARN: Level.WARNING, Severity.CRITICAL: Level.CRITICAL}


@dataclass(frozen=True, slots=True)
class GuardianEvent:
    """One thing that happened to a run, with the incident it belongs to (for context)."""

    key: str
    kind: EventKind
    run_id: str
    at: datetime
    level: Level
    incident: IncidentView
    mode: str = "enforce"
    state: State | None = None  # INTERVENTION: the state entered
    intervention: InterventionView | None = None
    detail: Mapping[str, object] = field(default_factory=dict)

    @property
    def check(self) -> str:
        return self.incident.check

    @property
    def last_change(self) -> datetime:
        """When the store last changed what this event announces: an escalation is news when it happens,
        even if the incident opened long before (the horizon is judged against this)."""
        return max(self.at, self.incident.updated_at) if self.kind is EventKind.INCIDENT else self.at


def incident_key(incident_id: int, suffix: str) -> str:
    """``incident:<id>:<suffix>``: suffix a severity label (opened or escalated) or ``closed``."""
    return f"incident:{incident_id}:{suffix}"


def intervention_key(event_id: int) -> str:
    """``intervention:<event id>``: an intervention entered a notified state."""
    return f"intervention:{event_id}"


def is_incident_alert(key: str) -> bool:
    """Whether ``key`` announces an incident (its opening or an escalation), not its closing."""
    return key.startswith("incident:") and not key.endswith(":closed")


def opening_keys(incident_id: int, keys: Iterable[str]) -> list[str]:
    """The keys among ``keys`` that announced incident ``incident_id`` (opening, escalations)."""
    prefix = incident_key(incident_id, "")
    return [k for k in keys if k.startswith(prefix) and is_incident_alert(k)]


def run_events(
    run_id: str,
    mode: str,
    incidents: Sequence[IncidentView],
    interventions: Sequence[tuple[InterventionView, Sequence[InterventionEventView]]],
) -> list[GuardianEvent]:
    """Every event of a run, oldest first (pure: the store's views in, events out)."""
    by_id = {i.id: i for i in incidents}
    events: list[GuardianEvent] = []
    for incident in incidents:
        level = _INCIDENT_LEVEL.get(incident.severity)
        if level is not None:
            key = incident_key(incident.id, incident.severity.label)
            events.append(GuardianEvent(key, EventKind.INCIDENT, run_id, incident.opened_at, level, incident, mode))
        if incident.closed_at is not None:
            closed_level = Level.CRITICAL if incident.status in ("gave_up", "unresolved") else Level.INFO
            events.append(
                GuardianEvent(
                    incident_key(incident.id, "closed"),
                    EventKind.INCIDENT_CLOSED,
                    run_id,
                    incident.closed_at,
                    closed_level,
                    incident,
                    mode,
                )
            )
    for intervention, timeline in interventions:
        incident_of = by_id.get(intervention.incident_id)
        if incident_of is None:
            continue
        previous: State | None = None
        for entry in timeline:
            state, repeated = State(entry.state), State(entry.state) == previous
            previous = state
            if state not in NOTIFIED_STATES or repeated:  # STOPPED is committed again with the rollback target
                continue
            events.append(
                GuardianEvent(
                    intervention_key(entry.id),
                    EventKind.INTERVENTION,
                    run_id,
                    entry.at,
                    NOTIFIED_STATES[state],
                    incident_of,
                    mode,
                    state=state,
                    intervention=intervention,
                    detail=entry.detail,
                )
            )
    events.sort(key=lambda e: (e.at, e.key))
    return events


def load_events(store: Store, run_id: str) -> list[GuardianEvent]:
    """``run_events`` over what ``store`` holds for ``run_id`` now."""
    run = store.get_run(run_id)
    incidents = store.list_incidents(run_id)
    timelines = store.run_timelines(run_id)
    interventions = [(iv, timelines.get(iv.id, [])) for iv in store.interventions(run_id)]
    return run_events(run_id, run.mode if run is not None else "observe", incidents, interventions)
