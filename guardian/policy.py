"""The intervention state machine and the decisions around it. Pure: no processes, files or clock.

An intervention runs

    DETECTED -> STOPPING -> STOPPED -> ROLLED_BACK -> PATCHED -> RESUMING -> PROBATION -> RESOLVED

and ends early in RELAPSED (the same trouble came back during probation, or the relaunch failed:
the next intervention climbs one rung of the ladder and rolls back one checkpoint further) or GAVE_UP
(budget spent, or no healthy checkpoint to go back to: the trainer is left stopped, the guardian
alerts loudly and exits 93, "do not requeue", the NVRx convention). A crash or a stall gets a
*restart* intervention: the same path with no patch (same config, latest healthy checkpoint).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class State(StrEnum):
    DETECTED = "DETECTED"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"
    ROLLED_BACK = "ROLLED_BACK"
    PATCHED = "PATCHED"
    RESUMING = "RESUMING"
    PROBATION = "PROBATION"
    RESOLVED = "RESOLVED"
    RELAPSED = "RELAPSED"
    GAVE_UP = "GAVE_UP"


class Kind(StrEnum):
    REMEDIATE = "remediate"  # a health incident: roll back, patch, resume
    RESTART = "restart"  # a crash or a stall: same config from the latest healthy checkpoint


# incidents of these checks are answered with a restart (Kind.RESTART), every other one with a remedy
RESTART_CHECKS: frozenset[str] = frozenset({"stall", "crash"})
# evidence key of a crash incident holding the trainer's last output: kept in the store, never sent out
# (a trainer may print a token), so alerts point at `guardian incidents show` instead
CRASH_OUTPUT_EVIDENCE = "stdout_tail"


FINISHED = frozenset({State.RESOLVED, State.RELAPSED, State.GAVE_UP})

ALLOWED: dict[State, frozenset[State]] = {
    State.DETECTED: frozenset({State.STOPPING, State.GAVE_UP}),
    State.STOPPING: frozenset({State.STOPPED}),
    State.STOPPED: frozenset({State.ROLLED_BACK, State.GAVE_UP}),
    State.ROLLED_BACK: frozenset({State.PATCHED, State.GAVE_UP}),
    State.PATCHED: frozenset({State.RESUMING}),
    State.RESUMING: frozenset({State.PROBATION, State.RELAPSED}),
    State.PROBATION: frozenset({State.RESOLVED, State.RELAPSED}),
    State.RESOLVED: frozenset(),
    State.RELAPSED: frozenset(),
    State.GAVE_UP: frozenset(),
}

# exit code of `guardian run` when it gave up: the run must not be requeued as is
EXIT_GAVE_UP = 93


class TransitionError(RuntimeError):
    """A transition the state machine does not allow (a bug, or a corrupted store)."""


def check_transition(current: State, new: State) -> None:
    if new not in ALLOWED[current]:
        allowed = ", ".join(sorted(ALLOWED[current])) or "none (finished)"
        raise TransitionError(f"intervention cannot go {current} -> {new}; allowed from {current}: {allowed}")


@dataclass(frozen=True, slots=True)
class PastIntervention:
    """What the policy needs to know of an earlier intervention of the run."""

    incident_id: int
    check: str
    kind: Kind
    rung: int
    state: State
    target_step: int | None


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do about an incident: intervene at ``rung`` avoiding ``exclude_steps``, or give up."""

    give_up: bool
    rung: int
    exclude_steps: frozenset[int]
    reason: str


def plan_intervention(
    *,
    incident_id: int,
    check: str,
    kind: Kind,
    past: Sequence[PastIntervention],
    budget: int,
    ladder_length: int,
) -> Plan:
    """Next intervention for an incident, given the run's earlier ones.

    Every earlier intervention for the same check climbs one rung (the last rung repeats): a relapse,
    or the same trouble coming back after a fix, calls for a stronger one. A relapse of the same
    incident also excludes every checkpoint an earlier attempt rolled back to, so the next rollback
    goes further back. The budget counts interventions of the same kind over the whole run.
    """
    same_kind = [p for p in past if p.kind is kind]
    if len(same_kind) >= budget:
        return Plan(True, 0, frozenset(), f"{kind.value} budget spent ({len(same_kind)} of {budget})")
    same_check = [p for p in same_kind if p.check == check]
    rung = min(len(same_check), max(ladder_length - 1, 0))
    earlier = [p for p in same_check if p.incident_id == incident_id]
    relapses = sum(1 for p in earlier if p.state is State.RELAPSED)
    exclude = frozenset(p.target_step for p in earlier if p.target_step is not None)
    why = f"rung {rung + 1} of {ladder_length}" if kind is Kind.REMEDIATE else "restart with the same config"
    if relapses:
        why += f" after {relapses} relapse(s), one checkpoint further back"
    elif same_check:
        why += f": {check} came back after {len(same_check)} earlier intervention(s)"
    return Plan(False, rung, exclude, why)


@dataclass(frozen=True, slots=True)
class ProbationVerdict:
    done: bool
    relapsed: bool
    reason: str


def judge_probation(
    *,
    target_step: int,
    newest_step: int | None,
    probation_steps: int,
    critical_checks_since_resume: Sequence[str],
    still_warning: bool = False,
) -> ProbationVerdict:
    """A resumed run passes probation after ``probation_steps`` healthy steps past the checkpoint; any
    critical finding on the resumed branch before that is a relapse. While the incident's own check
    still warns, probation runs on, up to twice as long."""
    if critical_checks_since_resume:
        return ProbationVerdict(True, True, f"critical again: {', '.join(sorted(set(critical_checks_since_resume)))}")
    if newest_step is None:
        return ProbationVerdict(False, False, "on probation")
    done = newest_step - target_step
    if done >= 2 * probation_steps or (done >= probation_steps and not still_warning):
        note = " (its check still warns)" if still_warning else ""
        return ProbationVerdict(True, False, f"{done} steps after the rollback without a critical finding{note}")
    return ProbationVerdict(False, False, "on probation")


def resume_deadline(*, typical_step_s: float | None, startup_s: float, factor: float = 5.0) -> float:
    """Seconds a relaunched trainer may take to log its first new step: its start-up allowance plus
    ``factor`` typical steps (verl spends minutes on start-up before the first step)."""
    return startup_s + factor * (typical_step_s or 0.0)
