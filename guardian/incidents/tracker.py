"""Turns each tick's findings into the events worth keeping: a check entering, worsening or leaving
trouble. Pure; the guard loop stores the events and the replay prints them."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from guardian.core import Finding, Severity


class Change(StrEnum):
    RAISED = "raised"  # OK/UNKNOWN -> WARN/CRITICAL
    ESCALATED = "escalated"  # WARN -> CRITICAL
    EASED = "eased"  # CRITICAL -> WARN
    CLEARED = "cleared"  # WARN/CRITICAL -> OK


@dataclass(frozen=True, slots=True)
class Transition:
    change: Change
    finding: Finding
    previous: Severity


@dataclass
class StatusTracker:
    """The latest finding per check, and the transitions between ticks."""

    latest: dict[str, Finding] = field(default_factory=dict)

    def update(self, findings: list[Finding]) -> list[Transition]:
        transitions: list[Transition] = []
        for finding in findings:
            before = self.latest.get(finding.check)
            previous = before.severity if before else Severity.UNKNOWN
            self.latest[finding.check] = finding
            change = _change(previous, finding.severity)
            if change is not None:
                transitions.append(Transition(change, finding, previous))
        return transitions

    def worst(self) -> Severity:
        return max((f.severity for f in self.latest.values()), default=Severity.UNKNOWN)

    def forget(self, check: str) -> None:
        """Drop what is known of ``check``: its next finding is a transition from unknown (raised again)."""
        self.latest.pop(check, None)


def _change(before: Severity, after: Severity) -> Change | None:
    troubled_before = before >= Severity.WARN
    if after >= Severity.WARN:
        if not troubled_before:
            return Change.RAISED
        if after > before:
            return Change.ESCALATED
        return Change.EASED if after < before else None
    # an UNKNOWN after trouble (signal vanished) is not a recovery
    return Change.CLEARED if troubled_before and after == Severity.OK else None
