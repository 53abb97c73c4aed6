"""Every status a stored row takes: interventions, incidents, runs, checkpoints, pins.

``StrEnum``s: the store keeps the values as text and hands back members, which compare equal to their values.
Which transitions are allowed is ``guardian.rescue.policy``'s."""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class State(StrEnum):
    """Where an intervention stands (``guardian.rescue.policy`` has the allowed transitions)."""

    DETECTED = "DETECTED"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"
    ROLLED_BACK = "ROLLED_BACK"
    PATCHED = "PATCHED"
    RESUMING = "RESUMING"
    PROBATION = "PROBATION"
    RESOLVED = "RESOLVED"
    UNRESOLVED = "UNRESOLVED"  # probation could not prove the fix helped: a person must look
    RELAPSED = "RELAPSED"
    GAVE_UP = "GAVE_UP"


# an intervention in one of these is over (a relapse ends it; the next one climbs the ladder)
FINISHED_STATES: Final = frozenset({State.RESOLVED, State.UNRESOLVED, State.RELAPSED, State.GAVE_UP})


class Kind(StrEnum):
    """What an intervention does."""

    REMEDIATE = "remediate"  # a health incident: roll back, patch, resume
    RESTART = "restart"  # a crash or a stall: same config from the latest healthy checkpoint


class IncidentStatus(StrEnum):
    OPEN = "open"
    RESOLVED = "resolved"  # recovered by itself (observe), or an intervention proved its fix
    UNRESOLVED = "unresolved"  # an intervention ran its probation without proof: a person must look
    GAVE_UP = "gave_up"
    DISMISSED = "dismissed"  # raised on a branch a rollback abandoned
    CLOSED = "closed"  # closed by a person (guardian incidents close): its note says who and why


CLOSED_INCIDENT_STATUSES: Final = frozenset(set(IncidentStatus) - {IncidentStatus.OPEN})


class RunStatus(StrEnum):
    ACTIVE = "active"
    FINISHED = "finished"
    GAVE_UP = "gave_up"


class Verdict(StrEnum):
    """A checkpoint's: may a rollback land on it?"""

    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    UNKNOWN = "unknown"  # saved before its step's metrics line arrived


class PinMode(StrEnum):
    """How a checkpoint's pinned copy was made (``guardian.checkpoints.pinning``)."""

    LINK = "link"  # every file hard-linked: no bytes added while the original exists
    COPY = "copy"  # hard links were refused (another filesystem, EPERM): the files were copied


class Mode(StrEnum):
    OBSERVE = "observe"  # judge, store, alert
    ADVISE = "advise"  # ... and say what an intervention would do
    ENFORCE = "enforce"  # ... and do it
