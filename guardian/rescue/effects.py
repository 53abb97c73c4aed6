"""What the rescue can do next: one frozen record per effect, chosen by ``decide`` and carried out by ``Executor``.

Each effect is one side effect (or none) and the commit that records it; ``ends_pass`` says whether the pass
goes on deciding after it."""

from __future__ import annotations

from dataclasses import dataclass, field

from guardian.actions.process import ExitStatus
from guardian.rescue.policy import Plan
from guardian.states import Kind, State
from guardian.store import CheckpointView, IncidentView, InterventionView, StateDetail, StoredPlan


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to do until something changes (a step, the trainer's end, the clock)."""

    ends_pass = True


@dataclass(frozen=True, slots=True)
class Advance:
    """Commit ``state`` with no side effect (or, for STOPPED, the rollback target chosen)."""

    iv: InterventionView
    state: State
    detail: StateDetail = field(default_factory=lambda: StateDetail())
    target_step: int | None = None
    target_path: str | None = None
    ends_pass = False


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop the trainer (every process of the attempt), then commit STOPPED."""

    iv: InterventionView
    ends_pass = False


@dataclass(frozen=True, slots=True)
class RollBack:
    """Move the abandoned branch aside - every checkpoint after ``to_step`` (None: all of them, a restart from
    scratch), its pins and its rollout dumps - dismiss the incidents raised on it, then commit ROLLED_BACK;
    ``restore``: first put ``to_step``'s pinned copy back in place (verl's retention emptied its folder)."""

    iv: InterventionView
    to_step: int | None
    why: str = ""
    restore: bool = False
    ends_pass = False


@dataclass(frozen=True, slots=True)
class Patch:
    """Plan the relaunch (the rung's patch, or the same config for a restart), then commit PATCHED; a patch the
    verl key table refuses gives up."""

    iv: InterventionView
    kind: Kind
    check: str  # the incident's: whose ladder the rung is on
    rung: int
    resume_from: str | None
    ends_pass = False


@dataclass(frozen=True, slots=True)
class Launch:
    """Record the next attempt with RESUMING in one transaction, then launch ``plan``."""

    iv: InterventionView
    plan: StoredPlan
    ends_pass = False


@dataclass(frozen=True, slots=True)
class Reattach:
    """RESUMING is stored but this guardian has not launched its attempt (it was restarted): launch it, or attach
    to the trainer an earlier guardian launched."""

    iv: InterventionView
    ends_pass = True


@dataclass(frozen=True, slots=True)
class Relapse:
    """The intervention failed (the relaunch, or the fix): commit RELAPSED; the next one climbs the ladder."""

    iv: InterventionView
    reason: str
    outcome: dict[str, object] | None = None
    ends_pass = True


@dataclass(frozen=True, slots=True)
class End:
    """Probation is over: commit RESOLVED or UNRESOLVED and close the incident the same way."""

    iv: InterventionView
    state: State
    reason: str
    outcome: dict[str, object]
    step: int | None  # the newest step: where the incident closes
    ends_pass = True


@dataclass(frozen=True, slots=True)
class CloseEnded:
    """An incident whose intervention ended before a restart, its close not committed: close it as it ended."""

    incident: IncidentView
    iv: InterventionView
    step: int | None  # the newest step: where the incident closes
    ends_pass = False


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Commit GAVE_UP, close the incident and the run as given up, leave the trainer stopped, exit 93."""

    iv: InterventionView
    reason: str
    ends_pass = True


@dataclass(frozen=True, slots=True)
class Intervene:
    """Open an intervention (DETECTED) for ``incident`` at the plan's rung, climbing past rungs that would change
    nothing in this run (asked of the planner: it composes the config)."""

    incident: IncidentView
    kind: Kind
    plan: Plan
    from_attempt_id: int | None  # the attempt the trouble is in
    ends_pass = False


@dataclass(frozen=True, slots=True)
class RecordCrash:
    """The trainer ended badly with no incident explaining it: open a crash incident with its last output."""

    status: ExitStatus
    step: int | None  # the newest step the trainer reached
    attempt_id: int | None  # the attempt that ended
    ends_pass = False


@dataclass(frozen=True, slots=True)
class SetupFailed:
    """The trainer of the user's command ended badly before its first training step (an import error, a bad
    config): record it with its last output (once), stop what it left, end the run - never relaunched, since the
    same command would fail the same way; a person must fix the command or its environment."""

    status: ExitStatus
    attempt_id: int | None  # the attempt that ended
    recorded: bool  # its incident is stored already (a guardian started again on the ended run)
    ends_pass = True


@dataclass(frozen=True, slots=True)
class Advise:
    """Advise mode: say once what an intervention would do about ``incident`` (roll back to ``target``; ``restore``:
    after putting its pinned copy back, verl's retention emptied its folder)."""

    incident: IncidentView
    kind: Kind
    target: CheckpointView | None
    restore: bool = False
    ends_pass = False


@dataclass(frozen=True, slots=True)
class StayGivenUp:
    """An earlier intervention gave up: keep the trainer stopped and exit 93 again."""

    ends_pass = True


@dataclass(frozen=True, slots=True)
class FinishRun:
    """The trainer ended and nothing is left to do: stop what it left behind, record the end, exit ``code``."""

    status: ExitStatus
    code: int
    unproven: tuple[int, ...]  # interventions left UNRESOLVED
    last_step: int | None
    ends_pass = True


Effect = (
    Wait
    | Advance
    | Stop
    | RollBack
    | Patch
    | Launch
    | Reattach
    | Relapse
    | End
    | CloseEnded
    | GiveUp
    | Intervene
    | RecordCrash
    | SetupFailed
    | Advise
    | StayGivenUp
    | FinishRun
)
