"""The intervention state machine and the decisions around it. Pure: no processes, files or clock.

    DETECTED -> STOPPING -> STOPPED -> ROLLED_BACK -> PATCHED -> RESUMING -> PROBATION -> RESOLVED

Ends early in RELAPSED (next rung, one checkpoint further back), GAVE_UP (exit 93, "do not requeue") or
UNRESOLVED (no proof the fix helped; the trainer keeps running). A crash or stall gets a *restart*: no patch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from guardian.rescue.outcome import Outcome
from guardian.states import Kind, State

# incidents of these checks are answered with a restart (Kind.RESTART), every other one with a remedy
RESTART_CHECKS: frozenset[str] = frozenset({"stall", "crash"})
# the check of an incident for a trainer that ended before its first training step: never relaunched
SETUP_FAILURE = "setup_failure"
# evidence key of a crash incident holding the trainer's last output: kept in the store, never sent out
# (a trainer may print a token), so alerts point at `guardian incidents show` instead
CRASH_OUTPUT_EVIDENCE = "stdout_tail"


ALLOWED: dict[State, frozenset[State]] = {
    State.DETECTED: frozenset({State.STOPPING, State.GAVE_UP}),
    State.STOPPING: frozenset({State.STOPPED}),
    State.STOPPED: frozenset({State.ROLLED_BACK, State.GAVE_UP}),
    State.ROLLED_BACK: frozenset({State.PATCHED, State.GAVE_UP}),
    State.PATCHED: frozenset({State.RESUMING}),
    State.RESUMING: frozenset({State.PROBATION, State.RELAPSED}),
    State.PROBATION: frozenset({State.RESOLVED, State.UNRESOLVED, State.RELAPSED}),
    State.RESOLVED: frozenset(),
    State.UNRESOLVED: frozenset(),
    State.RELAPSED: frozenset(),
    State.GAVE_UP: frozenset(),
}


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

    Every earlier intervention for the same check climbs one rung past the highest used (the last rung
    repeats): a relapse, or the same trouble coming back after a fix, calls for a stronger one. A relapse of the same
    incident also excludes every checkpoint an earlier attempt rolled back to, so the next rollback
    goes further back. The budget counts interventions of the same kind over the whole run.
    """
    same_kind = [p for p in past if p.kind is kind]
    if len(same_kind) >= budget:
        return Plan(True, 0, frozenset(), f"{kind.value} budget spent ({len(same_kind)} of {budget})")
    same_check = [p for p in same_kind if p.check == check]
    rung = min(max((p.rung + 1 for p in same_check), default=0), max(ladder_length - 1, 0))
    earlier = [p for p in same_check if p.incident_id == incident_id]
    relapses = sum(1 for p in earlier if p.state is State.RELAPSED)
    exclude = frozenset(p.target_step for p in earlier if p.target_step is not None)
    why = f"rung {rung + 1} of {ladder_length}" if kind is Kind.REMEDIATE else "restart with the same config"
    if relapses:
        why += f" after {relapses} relapse(s), one checkpoint further back"
    elif same_check:
        why += f": {check} came back after {len(same_check)} earlier intervention(s)"
    return Plan(False, rung, exclude, why)


class Ending(StrEnum):
    """How a probation ends (or that it goes on)."""

    ON_PROBATION = "on_probation"
    RESOLVED = "resolved"
    UNRESOLVED = "unresolved"
    RELAPSED = "relapsed"


@dataclass(frozen=True, slots=True)
class ProbationVerdict:
    ending: Ending
    reason: str

    @property
    def done(self) -> bool:
        return self.ending is not Ending.ON_PROBATION


def judge_probation(
    *,
    outcome: Outcome,
    probation_steps: int,
    max_factor: float,
    critical_checks_since_resume: Sequence[str],
    trainer_finished: bool = False,
) -> ProbationVerdict:
    """A resumed run passes probation after ``probation_steps`` steps past the checkpoint once the fix is
    proven (``Outcome.proven``: the failure shape gone and the reward at least the abandoned branch's).
    Any critical finding on the new branch is a relapse. Not proven yet: probation runs on, up to
    ``max_factor`` times as long (or until the trainer finishes); then a fix whose signal still shows the
    trouble while the reward also stayed short relapses (the next rung), and anything else short of proof
    is UNRESOLVED."""
    if critical_checks_since_resume:
        return ProbationVerdict(
            Ending.RELAPSED, f"critical again: {', '.join(sorted(set(critical_checks_since_resume)))}"
        )
    done = outcome.steps_after
    if done < probation_steps and not trainer_finished:
        return ProbationVerdict(Ending.ON_PROBATION, "on probation")
    figures = outcome.describe()
    if outcome.proven:
        # what was shown, not a claim: "20 steps after the rollback: at the same 21 steps: reward 0.271 on the new
        # branch vs 0.27 on the abandoned one (level, within ±0.014), entropy 0.324 vs 0.236 (higher); ..."
        return ProbationVerdict(Ending.RESOLVED, f"{done} steps after the rollback: {figures}")
    longest = max_factor * probation_steps
    if done < longest and not trainer_finished:
        return ProbationVerdict(Ending.ON_PROBATION, f"on probation, not proven yet: {figures}")
    when = "the trainer finished" if trainer_finished and done < longest else f"{done} steps"
    if not outcome.shape_gone and outcome.recovered is False:
        return ProbationVerdict(Ending.RELAPSED, f"after {when} the trouble persists: {figures}")
    return ProbationVerdict(Ending.UNRESOLVED, f"after {when} the fix is not proven: {figures}")


def resume_deadline(*, typical_step_s: float | None, startup_s: float, steps: float) -> float:
    """Seconds a relaunched trainer may take to log its first new step: its start-up allowance plus
    ``steps`` typical step times (verl spends minutes on start-up before the first step)."""
    return startup_s + steps * (typical_step_s or 0.0)
