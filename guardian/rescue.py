"""The rescue itself: the intervention state machine's steps, one state at a time.

``Supervisor`` (supervisor.py) decides *when* to intervene and owns the trainer process and attempts;
``Rescue``, its base class, moves an intervention through ``policy.State``:

    STOPPING -> STOPPED (target chosen) -> ROLLED_BACK -> PATCHED -> RESUMING -> PROBATION -> RESOLVED
                                                                                   (or UNRESOLVED, RELAPSED)

committing each state before its side effect (``_commit``), so that a guardian killed in between and
started again repeats only idempotent work.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from guardian.actions.checkpoints import (
    CheckpointError,
    choose_rollback_target,
    quarantine_after,
    quarantine_all,
    quarantine_dumps_after,
    resume_path_for,
)
from guardian.actions.patch import PatchPlan, RunFiles, crash_restart_plan, plan_patch
from guardian.actions.process import ExitStatus
from guardian.actions.verl_keys import PatchError
from guardian.checks.stall import typical_step_seconds
from guardian.config import GuardianConfig
from guardian.daemon import Clock, Guardian
from guardian.exits import EXIT_GAVE_UP
from guardian.findings import Severity
from guardian.launcher import RunFolder
from guardian.logs import event, get_logger
from guardian.outcome import measure_outcome
from guardian.policy import Ending, Kind, State, check_transition, judge_probation, resume_deadline
from guardian.store import CheckpointView, IncidentView, InterventionView, Store

log = get_logger("supervisor")
CRASH = "crash"


class Rescue:
    """The state machine's steps. The supervisor provides the collaborators and the trainer handling."""

    config: GuardianConfig
    store: Store
    run_id: str
    clock: Clock
    after_commit: Callable[[str], None]
    guardian: Guardian
    checkpoint_dir: Path
    folder: RunFolder
    exit_code: int | None
    rollouts_are_users: bool  # the run's command names trainer.rollout_data_dir: attempts share it

    # -- provided by the supervisor (the trainer process and its attempts) -------------------------
    def _stop_trainer(self, *, reason: str) -> None:
        raise NotImplementedError

    def _exit_status(self) -> ExitStatus | None:
        raise NotImplementedError

    def _start(self, attempt_id: int, number: int, argv: Sequence[str], extra_env: Mapping[str, str]) -> None:
        raise NotImplementedError

    def _reattach(self, iv: InterventionView) -> None:
        raise NotImplementedError

    def _launched_at(self, attempt_id: int | None) -> float | None:
        """When this guardian launched or attached attempt ``attempt_id``; None if it has not yet."""
        raise NotImplementedError

    def _next_attempt_number(self) -> int:
        raise NotImplementedError

    def _run_files(self, number: int) -> RunFiles:
        raise NotImplementedError

    def _current_argv(self) -> tuple[str, ...]:
        raise NotImplementedError

    # -- the steps ---------------------------------------------------------------------------------
    def _drive(self, iv: InterventionView) -> None:
        """Move ``iv`` forward as far as it can go in this tick."""
        while iv is not None and not iv.finished:
            moved = self._step(iv)
            if moved is None:
                return
            iv = moved

    def _step(self, iv: InterventionView) -> InterventionView | None:
        state = State(iv.state)
        incident = self.store.get_incident(iv.incident_id)
        assert incident is not None
        if state is State.DETECTED:
            return self._commit(iv, State.STOPPING)
        if state is State.STOPPING:
            self._stop_trainer(reason=iv.name)
            return self._commit(iv, State.STOPPED)
        if state is State.STOPPED:
            return self._roll_back(iv, incident.incident)
        if state is State.ROLLED_BACK:
            return self._patch(iv, incident.incident)
        if state is State.PATCHED:
            return self._relaunch(iv)
        if state is State.RESUMING:
            return self._verify_resume(iv)
        if state is State.PROBATION:
            return self._probation(iv, incident.incident)
        return None

    def _roll_back(self, iv: InterventionView, incident: IncidentView) -> InterventionView:
        earlier = [p for p in self.store.interventions(incident_id=incident.id) if p.id != iv.id]
        exclude = frozenset(p.target_step for p in earlier if p.target_step is not None)
        tried_scratch = any(p.target_step is None and p.plan is not None for p in earlier)
        rung = self.config.remediation.rung(incident.check, iv.rung)
        extra = rung.rollback_extra_checkpoints if rung is not None else 0
        if iv.target_step is None:
            target = self._target(incident, exclude, extra)
            if target is None and not tried_scratch:
                # trouble before the first healthy checkpoint: start again from scratch (patched, for a
                # health incident); the old branch's folders go to quarantine so new saves cannot overwrite them
                moved = quarantine_all(self.checkpoint_dir, incident.id)
                self._dismiss_abandoned(incident, after_step=0)
                return self._commit(
                    iv,
                    State.ROLLED_BACK,
                    detail={
                        "target": None,
                        "why": "no healthy checkpoint before the onset: from scratch",
                        "moved": [m.step for m in moved.moved],
                        **self._keep_dumps(0, incident.id),
                    },
                )
            if target is None:
                return self._give_up(
                    iv, "no healthy checkpoint left to roll back to (a restart from scratch failed too)"
                )
            limit = (incident.onset_step or incident.opened_step or 0) - self.config.remediation.margin_steps
            why = f"newest healthy checkpoint at or before step {limit}"
            if exclude:
                why += f", before the earlier targets {sorted(exclude)}"
            iv = self.store.advance(
                iv.id,
                State.STOPPED,
                now=self.clock(),
                target_step=target.step,
                target_path=target.path,
                detail={"target": target.path, "why": why},
            )
            self.after_commit("STOPPED+target")
        assert iv.target_step is not None
        try:
            moved = quarantine_after(self.checkpoint_dir, iv.target_step, incident.id)
        except CheckpointError as exc:
            return self._give_up(iv, f"rollback failed: {exc}")
        self._dismiss_abandoned(incident, after_step=iv.target_step)
        detail = {"moved": [m.step for m in moved.moved], "tracker": iv.target_step}
        return self._commit(iv, State.ROLLED_BACK, detail={**detail, **self._keep_dumps(iv.target_step, incident.id)})

    def _keep_dumps(self, after_step: int, incident_id: int) -> dict[str, object]:
        """The abandoned branch's rollout dumps, when the run's own command names the dump dir (each attempt
        gets its own dir otherwise, so nothing is overwritten): moved aside before the resume rewrites them."""
        if not self.rollouts_are_users or self.guardian.rollouts is None:
            return {}
        try:
            moved = quarantine_dumps_after(self.guardian.rollouts.path, after_step, incident_id)
        except (CheckpointError, OSError) as exc:
            log.error(event("dumps_not_kept", {"run": self.run_id, "dir": self.guardian.rollouts.path, "error": exc}))
            return {"dumps_kept": False}
        return {"dumps_quarantined": list(moved)} if moved else {}

    def _dismiss_abandoned(self, incident: IncidentView, *, after_step: int) -> None:
        """Close the other open incidents raised on the branch the rollback abandons."""
        for other in self.store.list_incidents(self.run_id, limit=1000):
            if other.is_open and other.id != incident.id and (other.opened_step or 0) > after_step:
                self.store.close_incident(
                    other.id,
                    status="dismissed",
                    now=self.clock(),
                    note=f"abandoned branch: rolled back to step {after_step}",
                )

    def _patch(self, iv: InterventionView, incident: IncidentView) -> InterventionView:
        number = self._next_attempt_number()
        files = self._run_files(number)
        try:
            if iv.kind == Kind.RESTART.value:
                plan = crash_restart_plan(self._current_argv(), resume_from=iv.target_path, run_files=files)
            else:
                rung = self.config.remediation.rung(incident.check, iv.rung)
                assert rung is not None
                plan = plan_patch(self._current_argv(), rung, resume_from=iv.target_path, run_files=files)
        except (PatchError, ValueError) as exc:
            return self._give_up(iv, f"patch refused: {exc}")
        return self._commit(
            iv,
            State.PATCHED,
            plan=_plan_json(plan),
            detail={"diff": [list(d) for d in plan.diff], "notes": list(plan.notes)},
        )

    def _relaunch(self, iv: InterventionView) -> InterventionView:
        assert iv.plan is not None
        number = self._next_attempt_number()
        argv = stored_argv(iv.plan["argv"])
        extra_env = stored_env(iv.plan["env"])
        # the new attempt and RESUMING in one transaction: a refused commit keeps neither, so the next pass
        # starts over from PATCHED instead of recording a second attempt while the first is never launched
        with self.store.transaction() as store:
            attempt = store.start_attempt(
                self.run_id, metrics_path=str(self.folder.metrics(number)), now=self.clock(), command=list(argv)
            )
            iv = self._advance(store, iv, State.RESUMING, to_attempt_id=attempt.id)
        self._committed(iv, State.RESUMING)
        self._start(attempt.id, attempt.number, argv, extra_env)
        return iv

    def _verify_resume(self, iv: InterventionView) -> InterventionView | None:
        started = self._launched_at(iv.to_attempt_id)
        if started is None:
            self._reattach(iv)  # a guardian restarted after committing RESUMING: launch (or attach) now
            return None
        target = iv.target_step or 0
        logged = self.guardian.attempt_steps
        trained = [s for s in logged if s > target]
        if logged and min(logged) < target:
            return self._relapse(iv, f"resumed at step {min(logged)}, expected {target}")
        if trained:
            return self._commit(iv, State.PROBATION, detail={"first_step": trained[0]})
        status = self._exit_status()
        if status is not None:
            return self._relapse(iv, f"relaunched trainer ended before a new step: {status.describe()}")
        deadline = resume_deadline(
            typical_step_s=typical_step_seconds(self.guardian.history),
            startup_s=self.config.intervention.startup_seconds,
        )
        if self.clock() - started > deadline:
            return self._relapse(iv, f"no new step {deadline:.0f}s after the relaunch")
        return None

    def _probation(self, iv: InterventionView, incident: IncidentView) -> InterventionView | None:
        target = iv.target_step or 0
        resumed = bool(self.guardian.attempt_steps)
        critical = (
            [
                f.check
                for f in self.guardian.tracker.latest.values()
                if f.severity == Severity.CRITICAL and f.step is not None and f.step > target
            ]
            if resumed
            else []
        )
        status = self._exit_status()
        if status is not None and not status.ok:
            critical.append(CRASH)
        own_check = None if iv.kind == Kind.RESTART.value else incident.check
        outcome = measure_outcome(
            self.guardian.history,
            target_step=target,
            own=self.guardian.tracker.latest.get(incident.check) if own_check and resumed else None,
            own_check=own_check,
            checks=self.config.checks,
        )
        verdict = judge_probation(
            outcome=outcome,
            probation_steps=self.config.intervention.probation_steps,
            critical_checks_since_resume=critical,
            trainer_finished=status is not None and status.ok,
        )
        if not verdict.done:
            return None
        detail = {"why": verdict.reason, "outcome": outcome.to_json()}
        if verdict.ending is Ending.RELAPSED:
            return self._relapse(iv, verdict.reason, outcome=outcome.to_json())
        final = State.RESOLVED if verdict.ending is Ending.RESOLVED else State.UNRESOLVED
        iv = self._commit(iv, final, detail=detail, note=None if final is State.RESOLVED else verdict.reason)
        self.store.close_incident(
            incident.id,
            status=final.value.lower(),
            now=self.clock(),
            step=self.guardian.history.last_step,
            note=f"intervention {iv.number}: {verdict.reason}",
        )
        name = "incident_resolved" if final is State.RESOLVED else "incident_unresolved"
        level = log.info if final is State.RESOLVED else log.critical
        level(
            event(name, {"run": self.run_id, "incident": incident.id, "intervention": iv.number, "why": verdict.reason})
        )
        return iv

    def _commit(self, iv: InterventionView, state: State, **fields: object) -> InterventionView:
        updated = self._advance(self.store, iv, state, **fields)
        self._committed(updated, state)
        return updated

    def _advance(self, store: Store, iv: InterventionView, state: State, **fields: object) -> InterventionView:
        """Write ``state`` on ``store`` (the store itself, or a transaction of it): ``_committed`` follows once
        it is committed."""
        check_transition(State(iv.state), state)
        detail = fields.pop("detail", None)
        return store.advance(iv.id, state.value, now=self.clock(), detail=detail, **fields)  # type: ignore[arg-type]

    def _committed(self, iv: InterventionView, state: State) -> None:
        log.warning(
            event(
                "intervention_state",
                {"run": self.run_id, "incident": iv.incident_id, "intervention": iv.number, "state": state.value},
            )
        )
        self.after_commit(state.value)

    def _relapse(self, iv: InterventionView, reason: str, **figures: object) -> InterventionView:
        log.error(
            event(
                "relapse", {"run": self.run_id, "incident": iv.incident_id, "intervention": iv.number, "reason": reason}
            )
        )
        return self._commit(iv, State.RELAPSED, note=reason, detail={"why": reason, **figures})

    def _give_up(self, iv: InterventionView, reason: str) -> InterventionView:
        iv = self._commit(iv, State.GAVE_UP, note=reason, detail={"why": reason})
        self.store.close_incident(iv.incident_id, status="gave_up", now=self.clock(), note=reason)
        self.store.set_run_status(self.run_id, "gave_up")
        log.critical(
            event(
                "gave_up",
                {
                    "run": self.run_id,
                    "incident": iv.incident_id,
                    "intervention": iv.number,
                    "reason": reason,
                    "exit_code": EXIT_GAVE_UP,
                },
            )
        )
        self._stop_trainer(reason="gave up")
        self.exit_code = EXIT_GAVE_UP
        return iv

    def _target(self, incident: IncidentView, exclude: frozenset[int], extra: int) -> CheckpointView | None:
        detected = incident.opened_step if incident.opened_step is not None else (self.guardian.history.last_step or 0)
        return choose_rollback_target(
            self.store.checkpoints(self.run_id),
            onset_step=incident.onset_step,
            detected_step=detected,
            margin_steps=self.config.remediation.margin_steps,
            exclude_steps=exclude,
            skip_newest=extra,
        )


def _plan_json(plan: PatchPlan) -> dict[str, object]:
    document = plan.to_json()
    document["env"] = dict(plan.files.env)
    document["resume_path"] = resume_path_for(plan.resume_from) if plan.resume_from else None
    return document


def stored_argv(value: object) -> tuple[str, ...]:
    """An argv as stored (JSON list)."""
    return tuple(str(a) for a in value) if isinstance(value, list | tuple) else ()


def stored_env(value: object) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}
