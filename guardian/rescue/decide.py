"""The rescue's decisions: the next effect for a run, from its snapshot and the configuration alone. Pure.

Called again after every effect that does not end the pass, so one pass can go from DETECTED to RESUMING;
returns ``Wait`` while the trainer has to show something first."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from guardian.checkpoints.target import choose_rollback_target
from guardian.checks.signs import startup_allowance
from guardian.config import GuardianConfig
from guardian.exits import EXIT_UNHEALTHY
from guardian.ladder import Rung
from guardian.rescue.effects import (
    Advance,
    Advise,
    CloseEnded,
    Effect,
    End,
    FinishRun,
    GiveUp,
    Intervene,
    Launch,
    Patch,
    Reattach,
    RecordCrash,
    Relapse,
    RollBack,
    SetupFailed,
    StayGivenUp,
    Stop,
    Wait,
)
from guardian.rescue.policy import (
    RESTART_CHECKS,
    SETUP_FAILURE,
    Ending,
    PastIntervention,
    Plan,
    judge_probation,
    plan_intervention,
    resume_deadline,
)
from guardian.rescue.snapshot import RescueSnapshot
from guardian.states import Kind, Mode, State
from guardian.store import CheckpointView, IncidentView, InterventionView

CRASH = "crash"  # the check name of an incident the guardian opens for a trainer that ended badly


def decide(s: RescueSnapshot, config: GuardianConfig) -> Effect:
    """The next effect: move the active intervention on; else keep a given-up run stopped; else end a run whose
    trainer failed before its first training step (a setup failure: no relaunch); else record a crash,
    act on the incident whose trouble began first (as the mode allows); else end the run once its trainer
    ended well (or, outside enforce mode, at all)."""
    active = s.active
    if active is not None:
        return _next_state(s, config, active)
    if s.gave_up():
        return StayGivenUp()
    if (ended := s.ended_but_open()) is not None:
        return CloseEnded(*ended, s.last_step)
    status = s.trainer.exit_status
    if status is not None and not status.ok and _before_first_step(s):
        recorded = any(i.check == SETUP_FAILURE and i.is_open for i in s.incidents)
        return SetupFailed(status, s.trainer.attempt_id, recorded)
    if status is not None and not status.ok and _unexplained_crash(s):
        return RecordCrash(status, s.last_step, s.trainer.attempt_id)
    incident = s.first_to_act_on()
    if incident is not None and s.mode is Mode.ADVISE and incident.id not in s.advised:
        target = rollback_target(s, config, incident, 0, frozenset())
        restores = target is not None and s.checkpoints.restores(target.step)
        return Advise(incident, kind_for(incident.check), target, restores)
    if incident is not None and s.mode is Mode.ENFORCE:
        plan = plan_for(s, config, incident)
        return Intervene(incident, kind_for(incident.check), plan, s.trainer.attempt_id)
    if status is None or (s.mode is Mode.ENFORCE and not status.ok):
        return Wait()
    # observe and advise report an unhealthy run (exit 3) as replay and watch do, and so does a rescue left unproven
    unproven = tuple(iv.id for iv in s.interventions if iv.state is State.UNRESOLVED)
    return FinishRun(status, EXIT_UNHEALTHY if incident is not None or unproven else 0, unproven, s.last_step)


def kind_for(check: str) -> Kind:
    return Kind.RESTART if check in RESTART_CHECKS else Kind.REMEDIATE


def _before_first_step(s: RescueSnapshot) -> bool:
    """The trainer of the user's command (not one the rescue relaunched) logged no training step: no line at all,
    or only the validation line verl writes at step 0 before it trains (``trainer.val_before_train``).

    Not a setup failure: a relaunch that ends before a new step (``_resuming`` relapses it, and the rescue goes on
    within its budgets: the relaunch was the rescue's choice, its checkpoint or patch may be what failed), and a
    command that resumes from its own checkpoint and ends after its validation line at that step (its step number
    cannot be told from a trained one's: it is a crash, restarted as before); nor a trainer this guardian stopped
    while the store was down (its collapse incident explains that end)."""
    attempt = s.trainer.attempt_id
    if attempt is None or s.trainer.stopped_in_outage or any(iv.to_attempt_id == attempt for iv in s.interventions):
        return False
    return all(step <= 0 for step in s.attempt_steps)


def _unexplained_crash(s: RescueSnapshot) -> bool:
    """A bad exit no open incident explains: none for a crash yet, and not a trainer this guardian stopped while
    the store was down (its collapse incident explains that one)."""
    open_critical = s.open_critical
    if s.trainer.stopped_in_outage and open_critical:
        return False
    return not any(i.check == CRASH for i in open_critical)


def plan_for(s: RescueSnapshot, config: GuardianConfig, incident: IncidentView, *, before: int | None = None) -> Plan:
    """The ladder's plan for ``incident`` given the run's interventions (those numbered below ``before`` when
    re-deciding for an intervention already opened); a remedy with no ladder gives up."""
    kind = kind_for(incident.check)
    ladder = config.remediation.ladders.get(incident.check, ())
    checks = {i.id: i.check for i in s.incidents}
    past = [
        PastIntervention(iv.incident_id, checks.get(iv.incident_id, ""), iv.kind, iv.rung, iv.state, iv.target_step)
        for iv in s.interventions
        if before is None or iv.number < before
    ]
    ic = config.intervention
    plan = plan_intervention(
        incident_id=incident.id,
        check=incident.check,
        kind=kind,
        past=past,
        budget=ic.restart_budget if kind is Kind.RESTART else ic.budget,
        ladder_length=len(ladder) or 1,
    )
    if kind is Kind.REMEDIATE and not ladder and not plan.give_up:
        return dataclasses.replace(plan, give_up=True, reason=f"no remediation ladder for {incident.check}")
    return plan


def climbed(plan: Plan, ladder: Sequence[Rung], rung: int) -> Plan:
    """``plan`` moved up to ``rung``: the rungs skipped would relaunch the run's config unchanged."""
    if plan.give_up or rung == plan.rung:
        return plan
    idle = ", ".join(r.name for r in ladder[plan.rung : rung])
    why = f"{plan.reason}; {idle} would change nothing in this run: rung {rung + 1} of {len(ladder)}"
    return dataclasses.replace(plan, rung=rung, reason=why)


# -- one intervention, state by state ----------------------------------------------------------------------
def _next_state(s: RescueSnapshot, config: GuardianConfig, iv: InterventionView) -> Effect:
    state = iv.state
    if state is State.DETECTED:
        return _detected(s, config, iv)
    if state is State.STOPPING:
        return Stop(iv)
    if state is State.STOPPED:
        return _stopped(s, config, iv)
    if state is State.ROLLED_BACK:
        return Patch(iv, iv.kind, s.incident(iv.incident_id).check, iv.rung, iv.target_path)
    if state is State.PATCHED:
        assert iv.plan is not None, f"{iv.name} is PATCHED without a plan"
        return Launch(iv, iv.plan)
    if state is State.RESUMING:
        return _resuming(s, config, iv)
    if state is State.PROBATION:
        return _probation(s, config, iv)
    return Wait()


def _detected(s: RescueSnapshot, config: GuardianConfig, iv: InterventionView) -> Effect:
    """The plan is decided again from the interventions before this one: the same plan as when it was opened, so
    a guardian killed right after opening it carries on (or gives up) exactly as it would have."""
    plan = plan_for(s, config, s.incident(iv.incident_id), before=iv.number)
    if plan.give_up:
        return GiveUp(iv, plan.reason)
    plan = climbed(plan, config.remediation.ladders.get(s.incident(iv.incident_id).check, ()), iv.rung)
    return Advance(iv, State.STOPPING, {"plan": plan.reason, "exclude_steps": sorted(plan.exclude_steps)})


def _stopped(s: RescueSnapshot, config: GuardianConfig, iv: InterventionView) -> Effect:
    """Choose the rollback target (committed on its own first), then roll back to it; with no healthy checkpoint
    before the onset, start again from scratch once, then give up."""
    if iv.target_step is not None:
        return RollBack(iv, iv.target_step, restore=s.checkpoints.restores(iv.target_step))
    incident = s.incident(iv.incident_id)
    earlier = [p for p in s.interventions if p.incident_id == iv.incident_id and p.id != iv.id]
    exclude = frozenset(p.target_step for p in earlier if p.target_step is not None)
    target = rollback_target(s, config, incident, iv.rung, exclude)
    if target is None:
        if any(p.target_step is None and p.plan is not None for p in earlier):
            return GiveUp(iv, "no healthy checkpoint left to roll back to (a restart from scratch failed too)")
        return RollBack(iv, None, "no healthy checkpoint before the onset: from scratch")
    limit = (incident.onset_step or incident.opened_step or 0) - config.remediation.margin_steps
    why = f"newest healthy checkpoint at or before step {limit}"
    if exclude:
        why += f", before the earlier targets {sorted(exclude)}"
    return Advance(iv, State.STOPPED, {"target": target.path, "why": why}, target.step, target.path)


def rollback_target(
    s: RescueSnapshot, config: GuardianConfig, incident: IncidentView, rung: int, exclude: frozenset[int]
) -> CheckpointView | None:
    """The newest healthy checkpoint at or before the onset (less the margin), not one of ``exclude``, on disk or
    pinned, as many more back as the rung asks."""
    remedy = config.remediation.rung(incident.check, rung)
    return choose_rollback_target(
        s.checkpoints.verdicts,
        onset_step=incident.onset_step,
        detected_step=incident.opened_step if incident.opened_step is not None else (s.last_step or 0),
        margin_steps=config.remediation.margin_steps,
        exclude_steps=exclude,
        available=s.checkpoints.available,
        skip_newest=remedy.rollback_extra_checkpoints if remedy is not None else 0,
    )


def _resuming(s: RescueSnapshot, config: GuardianConfig, iv: InterventionView) -> Effect:
    """The relaunched trainer must log a step past the target within its deadline, and not start before it."""
    launched = s.trainer.launched_at
    if s.trainer.attempt_id != iv.to_attempt_id or launched is None:
        return Reattach(iv)
    target = iv.target_step or 0
    logged = s.attempt_steps
    if logged and min(logged) < target:
        return Relapse(iv, f"resumed at step {min(logged)}, expected {target}")
    trained = [step for step in logged if step > target]
    if trained:
        return Advance(iv, State.PROBATION, {"first_step": trained[0]})
    status = s.trainer.exit_status
    if status is not None:
        return Relapse(iv, f"relaunched trainer ended before a new step: {status.describe()}")
    deadline = resume_deadline(
        typical_step_s=s.typical_step_s,
        startup_s=startup_allowance(
            config.intervention.startup_seconds, s.first_startup_s, config.checks.stall.startup_learned_factor
        ),
        steps=config.intervention.resume_deadline_steps,
    )
    if s.now - launched > deadline:
        return Relapse(iv, f"no new step {deadline:.0f}s after the relaunch")
    return Wait()


def _probation(s: RescueSnapshot, config: GuardianConfig, iv: InterventionView) -> Effect:
    """Judge the figures of the new branch: proven, relapsed, still on probation, or unproven at its end."""
    assert s.outcome is not None, "a PROBATION snapshot carries its outcome"
    target = iv.target_step or 0
    critical = [f.check for f in s.critical if f.step is not None and f.step > target] if s.attempt_steps else []
    status = s.trainer.exit_status
    if status is not None and not status.ok:
        critical.append(CRASH)
    verdict = judge_probation(
        outcome=s.outcome,
        probation_steps=config.intervention.probation_steps,
        max_factor=config.intervention.probation_max_factor,
        critical_checks_since_resume=critical,
        trainer_finished=status is not None and status.ok,
    )
    if not verdict.done:
        return Wait()
    figures = s.outcome.to_json()
    if verdict.ending is Ending.RELAPSED:
        return Relapse(iv, verdict.reason, figures)
    final = State.RESOLVED if verdict.ending is Ending.RESOLVED else State.UNRESOLVED
    return End(iv, final, verdict.reason, figures, s.last_step)
