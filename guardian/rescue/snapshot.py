"""The run as the rescue sees it at one moment: a frozen record, so every decision is a function of it alone.

Holds the guard loop's view (steps, critical findings, step time, probation figures), the store's incidents
and interventions, and the checkpoints view, read once per decision. ``decide`` reads nothing else."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from guardian.actions.process import ExitStatus
from guardian.checkpoints.view import CheckpointsView
from guardian.core import Severity
from guardian.rescue.outcome import Outcome
from guardian.states import Mode, State
from guardian.store import IncidentView, InterventionView


@dataclass(frozen=True, slots=True)
class TrainerFacts:
    """The trainer as this guardian knows it."""

    attempt_id: int | None = None  # the attempt this guardian launched or attached; None: none yet
    launched_at: float | None = None  # when it did
    exit_status: ExitStatus | None = None  # None: still running (or none known)
    stopped_in_outage: bool = False  # this guardian stopped it while the store refused writes


@dataclass(frozen=True, slots=True)
class StandingFinding:
    """A check's latest critical finding: which check, and at which step."""

    check: str
    step: int | None


@dataclass(frozen=True, slots=True)
class RescueSnapshot:
    now: float
    mode: Mode
    trainer: TrainerFacts
    attempt_steps: tuple[int, ...] = ()  # the steps the current attempt's metrics file logged
    last_step: int | None = None  # the newest step of the run's timeline
    typical_step_s: float | None = None
    first_startup_s: float | None = None  # how long the run's first launch took to its first step (None: not known)
    critical: tuple[StandingFinding, ...] = ()
    incidents: tuple[IncidentView, ...] = ()  # the run's, every status
    interventions: tuple[InterventionView, ...] = ()  # the run's, oldest first
    checkpoints: CheckpointsView = field(default_factory=CheckpointsView)  # disk and stored verdicts, while at risk
    outcome: Outcome | None = None  # the active intervention's probation figures (None outside PROBATION)
    advised: frozenset[int] = frozenset()  # incidents advise mode has spoken of

    @property
    def active(self) -> InterventionView | None:
        """The run's unfinished intervention (at most one runs at a time)."""
        return next((iv for iv in reversed(self.interventions) if not iv.finished), None)

    @property
    def open_critical(self) -> list[IncidentView]:
        return [i for i in self.incidents if i.is_open and i.severity == Severity.CRITICAL]

    def incident(self, incident_id: int) -> IncidentView:
        return next(i for i in self.incidents if i.id == incident_id)

    def gave_up(self) -> bool:
        return any(iv.state is State.GAVE_UP for iv in self.interventions)

    def ended_but_open(self) -> tuple[IncidentView, InterventionView] | None:
        """An open incident whose latest intervention already ended RESOLVED or UNRESOLVED: its close was not
        committed (the guardian died between the two), so it is closed now, not acted on again."""
        for incident in self.incidents:
            if not incident.is_open:
                continue
            ivs = [iv for iv in self.interventions if iv.incident_id == incident.id]
            if ivs and ivs[-1].state in (State.RESOLVED, State.UNRESOLVED):
                return incident, ivs[-1]
        return None

    def first_to_act_on(self) -> IncidentView | None:
        """The open critical incident whose trouble began first."""
        candidates = self.open_critical
        if not candidates:
            return None
        return min(candidates, key=lambda i: (i.onset_step if i.onset_step is not None else math.inf, i.id))
