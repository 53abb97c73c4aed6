"""The incident list's rows: each incident with the action taken, how it ended and what it cost. Pure row
building (``incident_row``) apart from the store reads (``incident_rows``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from guardian.config import CostConfig
from guardian.rescue.outcome import outcome_line
from guardian.review.cost import IncidentCost, RunCost, priced
from guardian.store import IncidentView, InterventionEventView, InterventionView, Store


@dataclass(frozen=True, slots=True)
class IncidentRow:
    """One line of ``guardian incidents list``."""

    incident: IncidentView
    action: InterventionView | None  # the newest intervention of the incident (None: none was taken)
    interventions: int
    outcome: Mapping[str, object] | None  # Outcome.to_json of the newest ending that recorded figures
    cost: IncidentCost | None  # None: no rollback threw steps away
    run_cost: RunCost  # the whole run's, beside the floor of the same incidents rescued by hand

    @property
    def gpu_hours_unknown(self) -> str | None:
        """Why GPU-hours are None although steps were lost."""
        return self.run_cost.rate.unknown if self.cost is not None else None

    @property
    def final_state(self) -> str:
        """Where it ended: the newest intervention's state, else the incident's status."""
        return str(self.action.state) if self.action is not None else str(self.incident.status)

    @property
    def outcome_line(self) -> str | None:
        return outcome_line(self.outcome) if self.outcome is not None else None

    @property
    def steps_lost(self) -> int:
        return self.cost.steps_lost if self.cost is not None else 0

    @property
    def gpu_hours_lost(self) -> float | None:
        return self.cost.gpu_hours if self.cost is not None else 0.0

    def to_json(self) -> dict[str, object]:
        """The stored incident (``IncidentView.to_json``: id, run_id, check, opened_step/at = detected, onset_step,
        ...) with the action, the outcome and the loss."""
        iv = self.action
        usd = self.cost.usd if self.cost is not None else 0.0
        return {
            **self.incident.to_json(),
            "action": None
            if iv is None
            else {
                "kind": iv.kind,
                "rung": iv.rung,
                "rung_name": iv.plan.rung if iv.plan else None,
                "intervention_number": iv.number,
                "state": iv.state,
            },
            "interventions": self.interventions,
            "final_state": self.final_state,
            "outcome": dict(self.outcome) if self.outcome is not None else None,
            "outcome_line": self.outcome_line,
            "steps_lost": self.steps_lost,
            "gpu_hours_lost": None if self.gpu_hours_lost is None else round(self.gpu_hours_lost, 3),
            "usd_lost": None if usd is None else round(usd, 2),
            "gpu_hours_unknown": self.gpu_hours_unknown,
        }


def last_outcome(timelines: Sequence[Sequence[InterventionEventView]]) -> Mapping[str, object] | None:
    """The figures of the newest event that recorded an outcome (RESOLVED, UNRESOLVED, RELAPSED)."""
    for timeline in reversed(timelines):
        for e in reversed(timeline):
            figures = e.detail.get("outcome")
            if isinstance(figures, Mapping):
                return figures
    return None


def incident_row(
    incident: IncidentView,
    interventions: Sequence[InterventionView],
    timelines: Mapping[int, Sequence[InterventionEventView]],
    cost: RunCost,
) -> IncidentRow:
    """One incident's row from its interventions (oldest first), their timelines and its run's cost."""
    own = [iv for iv in interventions if iv.incident_id == incident.id]
    spent = cost.incident(incident.id)
    spent = spent if spent is not None and spent.rolled_back else None
    return IncidentRow(
        incident=incident,
        action=own[-1] if own else None,
        interventions=len(own),
        outcome=last_outcome([timelines.get(iv.id, ()) for iv in own]),
        cost=spent,
        run_cost=cost,
    )


def incident_rows(
    store: Store,
    run_id: str | None,
    since: datetime | None,
    config: CostConfig,
    limit: int | None = None,
) -> tuple[IncidentRow, ...]:
    """The incidents (newest first, of one run or all, opened at or after ``since``) as list rows."""
    incidents = store.list_incidents(run_id, limit=limit, since=since)
    per_run: dict[str, tuple[list[InterventionView], dict[int, list[InterventionEventView]], RunCost | None]] = {}
    rows = []
    for incident in incidents:
        if incident.run_id not in per_run:
            run = store.get_run(incident.run_id)
            interventions = store.interventions(incident.run_id)
            timelines = store.run_timelines(incident.run_id)
            cost = priced(store, run, interventions, timelines, config) if run else None
            per_run[incident.run_id] = (interventions, timelines, cost)
        interventions, timelines, cost = per_run[incident.run_id]
        if cost is None:  # an incident whose run row is gone: nothing to price
            continue
        rows.append(incident_row(incident, interventions, timelines, cost))
    return tuple(rows)
