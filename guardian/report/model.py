"""The report's data: what ``assemble`` reads and ``page`` and ``svg`` draw. Frozen and free of I/O, so
rendering is a pure function of it and tests can build one by hand."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from guardian.report.series import Marker, Plot, StepRange
from guardian.report.story import Patch, TimelineRow
from guardian.report.trajectories import TrajectorySample
from guardian.review.cost import RunCost
from guardian.review.lineage import AttemptLink
from guardian.store import IncidentDetail, RunView


@dataclass(frozen=True, slots=True)
class Report:
    """Everything one report shows: an incident's (``incident`` set) or a whole run's."""

    run: RunView
    incident: IncidentDetail | None
    steps: StepRange | None  # the plotted step range; None: no step stored
    plots: tuple[Plot, ...]
    markers: tuple[Marker, ...]
    timeline: tuple[TimelineRow, ...]
    patches: tuple[Patch, ...]
    lineage: tuple[AttemptLink, ...]
    cost: RunCost
    trajectories: TrajectorySample | None  # None: the section is turned off (report.trajectories: 0)
    generated_at: datetime

    @property
    def title(self) -> str:
        if self.incident is None:
            return f"Run {self.run.id}"
        i = self.incident.incident
        return f"Incident #{i.id}: {i.check} ({i.severity.label}, {i.status})"
