"""The worst finding that stood at each step of the active timeline: what "healthy around a step" reads.

Used to pin only checkpoints healthy on both sides of their step (``guardian.checkpoints.pin_plan``). A note at
an earlier step than the newest is a resume: later notes belonged to the abandoned branch and are forgotten."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from guardian.core import Finding, Severity


@dataclass
class StepHealth:
    """Step -> the worst severity any check's finding had at that step, on the active timeline."""

    worst: dict[int, Severity] = field(default_factory=dict)
    _newest: int | None = None

    def note(self, step: int, findings: Iterable[Finding]) -> None:
        """The checks judged the timeline at ``step`` (its newest step) and found ``findings``."""
        if self._newest is not None and step < self._newest:
            self.worst = {s: v for s, v in self.worst.items() if s <= step}
        self._newest = step
        # a warning that only advises (the run learns while a signal is out of band) is healthy
        severity = max((Severity.OK if f.advice else f.severity for f in findings), default=Severity.UNKNOWN)
        self.worst[step] = max(severity, self.worst.get(step, Severity.UNKNOWN))

    def worst_between(self, first: int, last: int) -> Severity:
        """The worst severity noted at the steps ``first``..``last`` (UNKNOWN when none was noted there)."""
        return max((v for s, v in self.worst.items() if first <= s <= last), default=Severity.UNKNOWN)
