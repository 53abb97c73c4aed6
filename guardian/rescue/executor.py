"""Carries out what ``decide`` chose through the ports (trainer, checkpoints, planner).

Invariant: each state is committed *before* the side effect it announces, and every side effect is idempotent,
so a guardian killed in between repeats only idempotent work. ``run_pass`` returns the exit code once the run
is over (93 after giving up), else None."""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from guardian.actions.launcher import RunFolder
from guardian.checkpoints.pinning import PIN_DIR
from guardian.checkpoints.scan import CheckpointError
from guardian.config import GuardianConfig
from guardian.core import Clock, Finding, Severity
from guardian.exits import EXIT_GAVE_UP, EXIT_USAGE
from guardian.logs import event, get_logger
from guardian.rescue.decide import CRASH, climbed, decide
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
from guardian.rescue.policy import CRASH_OUTPUT_EVIDENCE, SETUP_FAILURE, check_transition
from guardian.rescue.ports import CheckpointPort, Launched, PlannerPort, TrainerPort
from guardian.rescue.snapshot import RescueSnapshot
from guardian.states import IncidentStatus, Kind, RunStatus, State
from guardian.store import IncidentView, InterventionView, StateDetail, Store
from guardian.verl_keys import PatchError

log = get_logger("supervisor")
# effects one pass may carry out before it must have waited or ended: DETECTED .. RESUMING is eight; more is a bug
MAX_EFFECTS_PER_PASS = 32


@dataclass
class Executor:
    config: GuardianConfig
    store: Store
    run_id: str
    folder: RunFolder
    clock: Clock
    trainer: TrainerPort
    checkpoints: CheckpointPort
    planner: PlannerPort
    # called right after each state is committed (the chaos tests kill the guardian there)
    after_commit: Callable[[str], None] = lambda state: None

    def __post_init__(self) -> None:
        self.advised: set[int] = set()  # incidents advise mode spoke of (told once per guardian)
        self._launched: list[Launched] = []  # launches since the supervisor last took them (it follows their files)

    def take_launches(self) -> list[Launched]:
        """The launches (and re-attaches) carried out since the last call, oldest first."""
        taken, self._launched = self._launched, []
        return taken

    def run_pass(self, snapshot: Callable[[], RescueSnapshot]) -> int | None:
        for _ in range(MAX_EFFECTS_PER_PASS):
            effect = decide(snapshot(), self.config)
            code = self.execute(effect)
            if code is not None or effect.ends_pass:
                return code
        raise RuntimeError(f"the rescue of run {self.run_id} did not settle in {MAX_EFFECTS_PER_PASS} effects")

    def execute(self, effect: Effect) -> int | None:
        """Carry out one effect; the exit code when it ends the run."""
        if isinstance(effect, Wait):
            return None
        if isinstance(effect, Advance):
            self._advance(effect)
        elif isinstance(effect, Stop):
            self.trainer.stop(reason=effect.iv.name)
            self._commit(effect.iv, State.STOPPED)
        elif isinstance(effect, RollBack):
            return self._roll_back(effect)
        elif isinstance(effect, Patch):
            return self._patch(effect)
        elif isinstance(effect, Launch):
            self._launch(effect)
        elif isinstance(effect, Reattach):
            self._reattach(effect.iv)
        elif isinstance(effect, Relapse):
            self._relapse(effect)
        elif isinstance(effect, End):
            self._end(effect)
        elif isinstance(effect, CloseEnded):
            self._close_ended(effect)
        elif isinstance(effect, GiveUp):
            return self._give_up(effect.iv, effect.reason)
        elif isinstance(effect, Intervene):
            self._intervene(effect)
        elif isinstance(effect, RecordCrash):
            self._record_crash(effect)
        elif isinstance(effect, SetupFailed):
            return self._setup_failed(effect)
        elif isinstance(effect, Advise):
            self._advise(effect)
        elif isinstance(effect, StayGivenUp):
            self.trainer.stop(reason="gave up")
            return EXIT_GAVE_UP
        elif isinstance(effect, FinishRun):
            return self._finish_run(effect)
        return None

    # -- commits -------------------------------------------------------------------------------------------
    def _commit(self, iv: InterventionView, state: State, detail: StateDetail | None = None, **fields: object) -> None:
        check_transition(iv.state, state)
        self.store.advance(iv.id, state, now=self.clock(), detail=detail, **fields)
        self._committed(iv, state)

    def _committed(self, iv: InterventionView, state: State) -> None:
        fields = {"run": self.run_id, "incident": iv.incident_id, "intervention": iv.number, "state": state.value}
        log.warning(event("intervention_state", fields))
        self.after_commit(state.value)

    def _advance(self, effect: Advance) -> None:
        if effect.state is State.STOPPED:  # the rollback target, committed before anything is moved
            self.store.advance(
                effect.iv.id,
                State.STOPPED,
                now=self.clock(),
                target_step=effect.target_step,
                target_path=effect.target_path,
                detail=effect.detail,
            )
            self.after_commit("STOPPED+target")
            return
        self._commit(effect.iv, effect.state, effect.detail)

    # -- the steps -----------------------------------------------------------------------------------------
    def _roll_back(self, effect: RollBack) -> int | None:
        iv, step = effect.iv, effect.to_step
        detail: StateDetail
        if step is None:
            # trouble before the first healthy checkpoint: the old branch's folders go to quarantine so that the
            # new run's saves cannot overwrite them
            try:
                moved = self.checkpoints.quarantine_all(iv.incident_id)
            except CheckpointError as exc:
                return self._give_up(iv, f"rollback failed: {exc}")
            detail = {"target": None, "why": effect.why, "moved": moved}
        else:
            try:
                restored = self.checkpoints.restore_pinned(step) if effect.restore else {}
                moved = self.checkpoints.quarantine_after(step, iv.incident_id)
            except CheckpointError as exc:
                return self._give_up(iv, f"rollback failed: {exc}")
            detail = {"moved": moved, "tracker": step, **restored}
        self._dismiss_abandoned(iv.incident_id, after_step=step or 0)
        self._commit(iv, State.ROLLED_BACK, {**detail, **self.checkpoints.set_aside_dumps(step or 0, iv.incident_id)})
        return None

    def _dismiss_abandoned(self, incident_id: int, *, after_step: int) -> None:
        """Close the other open incidents raised on the branch the rollback abandons."""
        for other in self.store.list_incidents(self.run_id):
            if other.is_open and other.id != incident_id and (other.opened_step or 0) > after_step:
                self.store.close_incident(
                    other.id,
                    status=IncidentStatus.DISMISSED,
                    now=self.clock(),
                    note=f"abandoned branch: rolled back to step {after_step}",
                )

    def _patch(self, effect: Patch) -> int | None:
        try:
            plan = self.planner.plan(effect.kind, effect.check, effect.rung, effect.resume_from)
        except (PatchError, ValueError) as exc:
            return self._give_up(effect.iv, f"patch refused: {exc}")
        detail: StateDetail = {"diff": [c.to_json() for c in plan.diff], "notes": list(plan.notes)}
        self._commit(effect.iv, State.PATCHED, detail, plan=plan)
        return None

    def _launch(self, effect: Launch) -> None:
        iv, plan = effect.iv, effect.plan
        latest = self.store.latest_attempt(self.run_id)
        number = (latest.number if latest else 0) + 1
        # the new attempt and RESUMING in one transaction: a refused commit keeps neither, so the next pass
        # starts over from PATCHED instead of recording a second attempt while the first is never launched
        with self.store.transaction() as store:
            attempt = store.start_attempt(
                self.run_id, metrics_path=str(self.folder.metrics(number)), now=self.clock(), command=list(plan.argv)
            )
            check_transition(iv.state, State.RESUMING)
            store.advance(iv.id, State.RESUMING, now=self.clock(), to_attempt_id=attempt.id)
        self._committed(iv, State.RESUMING)
        self._launched.append(self.trainer.launch(attempt, plan))

    def _reattach(self, iv: InterventionView) -> None:
        """RESUMING after a guardian restart: the attempt row exists; launch it unless it already was."""
        assert iv.to_attempt_id is not None and iv.plan is not None, f"{iv.name} is RESUMING without its attempt"
        attempt = next(a for a in self.store.attempts(self.run_id) if a.id == iv.to_attempt_id)
        self._launched.append(self.trainer.launch(attempt, iv.plan))

    def _relapse(self, effect: Relapse) -> None:
        iv = effect.iv
        fields = {"run": self.run_id, "incident": iv.incident_id, "intervention": iv.number, "reason": effect.reason}
        log.error(event("relapse", fields))
        detail: StateDetail = {"why": effect.reason}
        if effect.outcome is not None:
            detail["outcome"] = effect.outcome
        self._commit(iv, State.RELAPSED, detail, note=effect.reason)

    def _end(self, effect: End) -> None:
        iv, final, reason = effect.iv, effect.state, effect.reason
        resolved = final is State.RESOLVED
        self._commit(iv, final, {"why": reason, "outcome": effect.outcome}, note=None if resolved else reason)
        self.store.close_incident(
            iv.incident_id,
            status=IncidentStatus.RESOLVED if resolved else IncidentStatus.UNRESOLVED,
            now=self.clock(),
            step=effect.step,
            note=f"intervention {iv.number}: {reason}",
        )
        fields = {"run": self.run_id, "incident": iv.incident_id, "intervention": iv.number, "why": reason}
        if resolved:
            log.info(event("incident_resolved", fields))
        else:
            log.critical(event("incident_unresolved", fields))

    def _close_ended(self, effect: CloseEnded) -> None:
        """The close ``_end`` did not get to commit before the guardian stopped."""
        iv = effect.iv
        resolved = iv.state is State.RESOLVED
        note = f"intervention {iv.number} ended {iv.state.value} (closed after the guardian restarted)"
        self.store.close_incident(
            effect.incident.id,
            status=IncidentStatus.RESOLVED if resolved else IncidentStatus.UNRESOLVED,
            now=self.clock(),
            step=effect.step,
            note=note,
        )
        fields = {"run": self.run_id, "incident": effect.incident.id, "intervention": iv.number, "state": iv.state}
        log.warning(event("incident_closed_after_restart", fields))

    def _give_up(self, iv: InterventionView, reason: str) -> int:
        self._commit(iv, State.GAVE_UP, {"why": reason}, note=reason)
        self.store.close_incident(iv.incident_id, status=IncidentStatus.GAVE_UP, now=self.clock(), note=reason)
        self.store.set_run_status(self.run_id, RunStatus.GAVE_UP)
        fields = {
            "run": self.run_id,
            "incident": iv.incident_id,
            "intervention": iv.number,
            "reason": reason,
            "exit_code": EXIT_GAVE_UP,
        }
        log.critical(event("gave_up", fields))
        self.trainer.stop(reason="gave up")
        return EXIT_GAVE_UP

    # -- opening an intervention, a crash, advice, the end ---------------------------------------------------
    def _intervene(self, effect: Intervene) -> None:
        incident, kind, plan = effect.incident, effect.kind, effect.plan
        ladder = self.config.remediation.ladders.get(incident.check, ())
        if kind is Kind.REMEDIATE and ladder and not plan.give_up:
            with contextlib.suppress(PatchError, ValueError):  # the patch step refuses it with the reason
                plan = climbed(plan, ladder, self.planner.first_effective_rung(ladder, plan.rung))
        iv = self.store.create_intervention(
            self.run_id,
            incident.id,
            kind=kind,
            rung=plan.rung,
            from_attempt_id=effect.from_attempt_id,
            now=self.clock(),
        )
        self.after_commit(State.DETECTED.value)
        fields = {
            "run": self.run_id,
            "intervention": iv.number,
            "incident": incident.id,
            "check": incident.check,
            "kind": kind.value,
            "plan": plan.reason,
        }
        log.error(event("intervention", fields))

    def _record_crash(self, effect: RecordCrash) -> None:
        status, step = effect.status, effect.step
        tail, last = self._output_tail()
        finding = Finding(
            CRASH,
            Severity.CRITICAL,
            step,
            f"trainer ended: {status.describe()}" + (f": {last}" if last else ""),
            step,
            {"exit_code": status.exit_code, "signal": status.signal, CRASH_OUTPUT_EVIDENCE: tail},
        )
        crash = self._open(finding, effect.attempt_id)
        fields = {"run": self.run_id, "incident": crash.id, "check": CRASH, "message": finding.message}
        log.error(event("incident_opened", fields))

    def _output_tail(self) -> tuple[str, str]:
        """The end of the trainer's output and its last line (or why it could not be read), for an incident."""
        try:
            tail = self.trainer.output_tail()
        except OSError as exc:
            log.warning(event("crash_output_unreadable", {"run": self.run_id, "error": exc}))
            return "", f"(its output could not be read: {exc})"
        return tail, tail.splitlines()[-1] if tail else ""

    def _open(self, finding: Finding, attempt_id: int | None) -> IncidentView:
        now = self.clock()
        with self.store.transaction() as store:
            incident = store.open_incident(self.run_id, finding, now)
            store.add_finding(self.run_id, attempt_id, finding, now, incident.id)
        return incident

    def _setup_failed(self, effect: SetupFailed) -> int:
        """A setup failure (``decide._before_first_step``): the incident keeps the output's tail (as a crash's does),
        one line says where, and the run ends with exit 2 (bad command or configuration) - a relaunch of the same
        command would only fail again, after another start-up."""
        status = effect.status
        recorded = self.store.list_incidents(self.run_id) if effect.recorded else []
        incident = next((i for i in recorded if i.check == SETUP_FAILURE and i.is_open), None)
        if incident is None:
            tail, last = self._output_tail()
            why = f"trainer ended before its first training step: {status.describe()}"
            evidence = {"exit_code": status.exit_code, "signal": status.signal, CRASH_OUTPUT_EVIDENCE: tail}
            finding = Finding(
                SETUP_FAILURE, Severity.CRITICAL, None, why + (f": {last}" if last else ""), None, evidence
            )
            incident = self._open(finding, effect.attempt_id)
        self.trainer.finish(status)
        self.store.set_run_status(self.run_id, RunStatus.FINISHED)
        attempt = next((a for a in self.store.attempts(self.run_id) if a.id == effect.attempt_id), None)
        stdout = self.folder.stdout(attempt.number) if attempt is not None else None
        fields = {
            "run": self.run_id,
            "attempt": attempt.number if attempt is not None else None,
            "exit": status.describe(),
            "message": incident.message,
            "incident": incident.id,
            "output": f"guardian incidents show {incident.id}",
            "log": stdout if stdout is not None and stdout.is_file() else None,
            "exit_code": EXIT_USAGE,
            "fix": "fix the command or its environment, then start the run anew (guardian run --new ...)",
        }
        log.critical(event("setup_failed", fields))
        return EXIT_USAGE

    def _advise(self, effect: Advise) -> None:
        incident = effect.incident
        self.advised.add(incident.id)
        fields = {"run": self.run_id, "incident": incident.id, "check": incident.check, "action": self._advice(effect)}
        log.warning(event("advice", fields))

    def _advice(self, effect: Advise) -> str:
        target, check = effect.target, effect.incident.check
        if target is None:
            return "give up: no healthy checkpoint at or before the onset"
        restore = _restore_advice(Path(target.path)) if effect.restore else ""
        if effect.kind is Kind.RESTART:
            return f"{restore}restart from {target.path} with the same config"
        ladder = self.config.remediation.ladders.get(check, ())
        if not ladder:
            return "alert only: no remediation ladder"
        rung = self.planner.first_effective_rung(ladder, 0)
        plan = self.planner.plan(Kind.REMEDIATE, check, rung, target.path)
        return f"{restore}roll back to step {target.step} and relaunch: {' '.join(plan.argv)}"

    def _finish_run(self, effect: FinishRun) -> int:
        self.trainer.finish(effect.status)
        self.store.set_run_status(self.run_id, RunStatus.FINISHED)
        fields = {"run": self.run_id, "last_step": effect.last_step, "trainer": effect.status.describe()}
        log.info(event("run_finished", fields))
        if effect.unproven:
            log.critical(event("run_unresolved", {"run": self.run_id, "interventions": list(effect.unproven)}))
        return effect.code


def _restore_advice(folder: Path) -> str:
    """How a person puts back the pinned copy of a checkpoint whose folder verl's retention emptied (what the
    rescue's restore does: the emptied folder set aside, hard links to the pin in its place)."""
    pinned = folder.parent / PIN_DIR / folder.name
    aside = f"{folder}.emptied"
    return (
        f"restore its pin first (mv {shlex.quote(str(folder))} {shlex.quote(aside)} && cp -al "
        f"{shlex.quote(str(pinned))} {shlex.quote(str(folder))}), then "
    )
