"""The attempts lineage of a run: which launch came from which, resumed from where, with what change.
Pure over stored rows (``lineage`` reads them first). An intervention's attempt descends from the one it stopped
(``from_attempt_id``) and resumed from its rollback target with its plan's patch."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from guardian.actions.patch import RESUME_KEYS
from guardian.notify.compose import format_setting
from guardian.states import Kind
from guardian.store import AttemptView, ConfigChange, InterventionView, StepIndex, Store

COMMAND_SUMMARY_MAX = 120  # characters of the program part of a command summary


@dataclass(frozen=True, slots=True)
class Launcher:
    """The intervention that launched an attempt, as people name it."""

    intervention_id: int
    number: int  # run-wide (``intervention 2 of incident #3``)
    incident_id: int
    kind: Kind
    rung: int  # 0-based as stored
    rung_name: str | None
    from_attempt: int | None  # the number of the attempt it stopped

    @property
    def name(self) -> str:
        return f"intervention {self.number} of incident #{self.incident_id}"

    def to_json(self) -> dict[str, object]:
        return {
            "intervention_id": self.intervention_id,
            "number": self.number,
            "incident_id": self.incident_id,
            "kind": self.kind,
            "rung": self.rung,
            "rung_name": self.rung_name,
            "from_attempt": self.from_attempt,
        }


@dataclass(frozen=True, slots=True)
class AttemptLink:
    """One attempt in the lineage."""

    number: int
    attempt_id: int
    command: tuple[str, ...]  # empty: the trainer was not launched by the guardian (guardian watch)
    patch: tuple[ConfigChange, ...]  # what its launcher changed against the attempt it stopped
    launched_by: Launcher | None  # None: launched by a person
    resumed_from_step: int | None  # None: the first attempt, or a start from scratch
    resumed_from_path: str | None
    started_at: datetime
    ended_at: datetime | None
    exit_code: int | None
    first_step: int | None  # None: it logged no step
    last_step: int | None

    @property
    def summary(self) -> str:
        """One line: the command for a person's launch; the resume point and the patch (its settings, not the
        resume keys) for an intervention's."""
        if self.launched_by is None:
            return command_summary(self.command)
        where = f"resumed from step {self.resumed_from_step}" if self.resumed_from_step is not None else "from scratch"
        changes = "; ".join(
            f"{c.key}: {format_setting(c.before)} -> {format_setting(c.after)}"
            for c in self.patch
            if c.key not in RESUME_KEYS  # the resume point is said first
        )
        return f"{where}, " + (f"patch {changes}" if changes else "same config")

    def to_json(self) -> dict[str, object]:
        return {
            "number": self.number,
            "attempt_id": self.attempt_id,
            "summary": self.summary,
            "command": list(self.command),
            "patch": [c.to_json() for c in self.patch],
            "launched_by": self.launched_by.to_json() if self.launched_by else None,
            "resumed_from_step": self.resumed_from_step,
            "resumed_from_path": self.resumed_from_path,
            "started_at": self.started_at.isoformat(),
            "ended_at": self.ended_at.isoformat() if self.ended_at else None,
            "exit_code": self.exit_code,
            "first_step": self.first_step,
            "last_step": self.last_step,
        }


def command_summary(argv: Sequence[str]) -> str:
    """A training command in one short line: the program (its words before the first ``key=value``) and how
    many overrides follow (the full argv is in ``--json``)."""
    if not argv:
        return "not launched by the guardian"
    program = list(argv[: next((i for i, a in enumerate(argv) if "=" in a), len(argv))])
    overrides = len(argv) - len(program)
    text = shlex.join(program) or "(overrides only)"
    if len(text) > COMMAND_SUMMARY_MAX:
        text = text[: COMMAND_SUMMARY_MAX - 1] + "…"
    return text + (f" + {overrides} override(s)" if overrides else "")


def _argv(command: object) -> tuple[str, ...]:
    return tuple(str(a) for a in command) if isinstance(command, list | tuple) else ()


def build_lineage(
    attempts: Sequence[AttemptView], interventions: Sequence[InterventionView], index: Sequence[StepIndex]
) -> tuple[AttemptLink, ...]:
    """The lineage from stored rows, oldest attempt first."""
    numbers = {a.id: a.number for a in attempts}
    launched = {iv.to_attempt_id: iv for iv in interventions if iv.to_attempt_id is not None}
    steps: dict[int, list[int]] = {}
    for row in index:
        steps.setdefault(row.attempt_id, []).append(row.step)
    links = []
    for a in sorted(attempts, key=lambda a: a.number):
        iv = launched.get(a.id)
        logged = steps.get(a.id, [])
        launcher = None
        if iv is not None:
            launcher = Launcher(
                iv.id,
                iv.number,
                iv.incident_id,
                iv.kind,
                iv.rung,
                iv.plan.rung if iv.plan else None,
                numbers.get(iv.from_attempt_id) if iv.from_attempt_id is not None else None,
            )
        links.append(
            AttemptLink(
                number=a.number,
                attempt_id=a.id,
                command=_argv(a.command),
                patch=iv.plan.diff if iv is not None and iv.plan else (),
                launched_by=launcher,
                resumed_from_step=iv.target_step if iv is not None else None,
                resumed_from_path=iv.target_path if iv is not None and iv.target_step is not None else None,
                started_at=a.started_at,
                ended_at=a.ended_at,
                exit_code=a.exit_code,
                first_step=min(logged, default=None),
                last_step=max(logged, default=None),
            )
        )
    return tuple(links)


def lineage(store: Store, run_id: str) -> tuple[AttemptLink, ...]:
    """The run's attempts lineage, oldest first (empty for a run the store does not know)."""
    return build_lineage(store.attempts(run_id), store.interventions(run_id), store.step_index(run_id))
