"""What the rescue's executor needs from the world, as protocols: the trainer, the checkpoint folders, the planner.

``rescue.local`` provides the implementations on one machine (a process group per attempt, the run's checkpoint
directory, verl's Hydra config), ``rescue.ray_jobs`` a trainer run as Ray Jobs; the unit tests provide recording
ones. A launch is returned as data (``Launched``), never called back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from guardian.actions.process import ExitStatus
from guardian.ladder import Rung
from guardian.states import Kind
from guardian.store import AttemptView, StateDetail, StoredPlan


@dataclass(frozen=True, slots=True)
class Launched:
    """A trainer launch (or a re-attach to one an earlier guardian launched): the guard loop follows its files."""

    attempt_id: int
    number: int
    argv: tuple[str, ...]


class TrainerPort(Protocol):
    def stop(self, *, reason: str) -> None:
        """Stop every process of the current attempt and record its end; nothing running is fine. Raises when
        processes survive SIGKILL (never two trainers at once)."""

    def launch(self, attempt: AttemptView, plan: StoredPlan) -> Launched:
        """Launch ``attempt`` with ``plan``, or attach to it when an earlier guardian already launched it."""

    def output_tail(self) -> str:
        """The end of the current attempt's output (a crash's last words). Raises OSError when it cannot be read."""

    def finish(self, status: ExitStatus) -> None:
        """The trainer ended by itself: stop what it left running (as the mode allows) and record its end."""


class CheckpointPort(Protocol):
    def restore_pinned(self, step: int) -> StateDetail:
        """Put ``step``'s pinned copy back in place of the folder verl's retention emptied (what stood there is
        set aside, never deleted); what was done, for the ROLLED_BACK event. Idempotent; raises ``CheckpointError``
        when it cannot be done."""

    def quarantine_after(self, step: int, incident_id: int) -> list[int]:
        """Move every checkpoint after ``step`` and their pins aside (never deleted) and point verl's tracker at
        ``step``; the steps moved. Raises ``CheckpointError`` when that is impossible."""

    def quarantine_all(self, incident_id: int) -> list[int]:
        """Move every checkpoint and every pin aside (a restart from scratch): the steps moved."""

    def set_aside_dumps(self, after_step: int, incident_id: int) -> StateDetail:
        """Move the abandoned branch's rollout dumps aside when the attempts share the user's dump dir; what was
        done, for the ROLLED_BACK event (empty when there was nothing to do)."""


class PlannerPort(Protocol):
    def plan(self, kind: Kind, check: str, rung: int, resume_from: str | None) -> StoredPlan:
        """The relaunch: ``check``'s rung ``rung`` applied to the current command (the same config for a restart),
        resumed from ``resume_from`` (None: from scratch). Raises ``PatchError``/``ValueError`` when refused."""

    def first_effective_rung(self, ladder: Sequence[Rung], start: int) -> int:
        """The first rung from ``start`` that changes the current command's config."""
