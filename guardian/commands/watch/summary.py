"""What ``guardian watch`` says when it ends: the verdict and the summary. Pure, but for the tracker of the first
critical finding.

The verdict is the replay's: UNHEALTHY when a check was critical at any step read (first step and check named), even
if it cleared; HEALTHY otherwise (warnings do not count). It depends on the steps read, never on the watch's length.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from guardian.commands.watch.end import EndReason
from guardian.core import Finding, Severity
from guardian.incidents.tracker import Change, StatusTracker, Transition


@dataclass
class VerdictTracker(StatusTracker):
    """A ``StatusTracker`` that also keeps the first critical finding: every one, including those a
    restarted watch does not store again (the daemon reports only the transitions it stores)."""

    first_critical: Finding | None = None

    def update(self, findings: list[Finding]) -> list[Transition]:
        transitions = super().update(findings)
        if self.first_critical is None:
            self.first_critical = next(
                (
                    t.finding
                    for t in transitions
                    if t.finding.severity == Severity.CRITICAL and t.change in (Change.RAISED, Change.ESCALATED)
                ),
                None,
            )
        return transitions


class Verdict(StrEnum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    NOT_ENOUGH_DATA = "not_enough_data"
    NO_STEPS = "no_steps"


@dataclass(frozen=True, slots=True)
class IncidentLine:
    id: int
    check: str
    severity: str
    status: str
    onset_step: int | None


@dataclass(frozen=True, slots=True)
class WatchSummary:
    run_id: str
    path: str
    reason: EndReason
    steps_read: int
    last_step: int | None
    signals: tuple[str, ...]
    bad_lines: int
    incidents: tuple[IncidentLine, ...]
    first_critical: Finding | None
    store_url: str  # password masked
    pid: int | None = None
    total_steps: int | None = None
    too_little: str | None = None  # why the steps read are too few to judge (policy.too_little_to_judge)

    @property
    def verdict(self) -> Verdict:
        if self.first_critical is not None:
            return Verdict.UNHEALTHY
        if not self.steps_read:
            return Verdict.NO_STEPS
        return Verdict.NOT_ENOUGH_DATA if self.too_little else Verdict.HEALTHY


def verdict_text(summary: WatchSummary) -> str:
    first = summary.first_critical
    if first is not None:
        return f"UNHEALTHY from step {first.step} ({first.check})"
    if summary.verdict is Verdict.NO_STEPS:
        return f"NO STEPS: nothing read from {summary.path} to judge"
    if summary.verdict is Verdict.NOT_ENOUGH_DATA:
        return f"NOT ENOUGH DATA ({summary.too_little}): no verdict of health"
    return "HEALTHY"


def ended_text(summary: WatchSummary) -> str:
    return {
        EndReason.END_OF_FILE: f"read {summary.path} to its end",
        EndReason.TOTAL_STEPS: f"the run reached its total_training_steps ({summary.total_steps})",
        EndReason.TRAINER_EXITED: f"the trainer process {summary.pid} exited",
        EndReason.INTERRUPTED: "interrupted (Ctrl-C or SIGTERM); judged on the steps read so far",
        EndReason.TICK_FAILURES: "gave up after failed ticks, the run is UNGUARDED (event=guardian_cannot_continue "
        "says what to do); judged on the steps read so far",
        EndReason.TICK_LIMIT: "tick limit reached",
        EndReason.UNREADABLE: f"{summary.path} became unreadable (event=watch_error says why); judged on the steps "
        "read so far",
    }[summary.reason]


def summary_lines(summary: WatchSummary) -> list[str]:
    last = f" (last step {summary.last_step})" if summary.last_step is not None else ""
    lines = [
        f"watch ended: {ended_text(summary)}",
        f"steps read: {summary.steps_read}{last}",
        f"signals: {', '.join(summary.signals) or 'none'}",
    ]
    if summary.bad_lines:
        lines.append(f"unreadable lines: {summary.bad_lines} skipped (event=bad_line in the log names each)")
    if summary.incidents:
        lines.append("incidents:")
        lines.extend(
            f"  #{i.id} {i.check} {i.severity} {i.status}"
            + (f" onset ~{i.onset_step}" if i.onset_step is not None else "")
            for i in summary.incidents
        )
    else:
        lines.append("incidents: none")
    lines.append(f"verdict: {verdict_text(summary)}")
    lines.append(f"history: {summary.store_url} run {summary.run_id} (guardian incidents list --run {summary.run_id})")
    return lines
