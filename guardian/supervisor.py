"""``guardian run``: launch the trainer, guard it, and carry out the rescue when it collapses.

One ``tick()`` polls the run (``daemon.Guardian``), checks the trainer process, decides whether an
incident needs an intervention (``policy.plan_intervention``) and moves the current one forward (the
steps live in ``rescue.Rescue``, this class's base). Every state is committed to the
store *before* its side effect and every side effect is idempotent (stop an already-stopped trainer,
quarantine already-moved folders, attach to an attempt that was already launched), so a guardian killed
at any point and started again (``guardian run --attach RUN_ID``) finishes the intervention exactly once.

While the store refuses writes (``Guardian.store_degraded``) the supervisor *holds* (``_hold``): it goes on
judging from memory and, in enforce mode, stops a collapsing trainer, but it neither starts nor advances an
intervention until the store takes writes again; then the normal tick carries on from what is stored (the
replayed findings open the incident, whose intervention stops the already-stopped trainer idempotently).
Holding rather than rolling back from memory keeps the one rule the rescue rests on - a state is stored
before its side effect - so a guardian killed during the outage can never relaunch twice or lose which
folders it quarantined, and the rollback target is chosen from stored checkpoint verdicts. The cost is a
stopped trainer waiting for the store; past ``outage.STORE_WAIT_S`` of that the guardian gives up
(``cannot_continue``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from guardian.actions import strays
from guardian.actions.ladder import Rung
from guardian.actions.patch import RunFiles, first_effective_rung, plan_patch
from guardian.actions.process import ExitStatus, StopPolicy, TrainerControl, TrainerHandle
from guardian.actions.verl_keys import PatchError
from guardian.config import GuardianConfig
from guardian.daemon import Clock, Guardian
from guardian.exits import EXIT_ERROR, EXIT_GAVE_UP, EXIT_UNHEALTHY
from guardian.findings import Finding, Severity
from guardian.launcher import RunFolder, attach_attempt, launch_attempt
from guardian.logs import event, get_logger
from guardian.notify.compose import Alert, cannot_continue_alert
from guardian.outage import StoreWait, stop_while_store_down, trainer_fate
from guardian.policy import (
    CRASH_OUTPUT_EVIDENCE,
    RESTART_CHECKS,
    Kind,
    PastIntervention,
    Plan,
    State,
    plan_intervention,
)
from guardian.rescue import CRASH, Rescue, stored_argv, stored_env
from guardian.sources.jsonl import MetricsFile
from guardian.sources.rollouts import RolloutDir
from guardian.store import IncidentView, InterventionView, Store
from guardian.store.writebehind import outage_fix, unavailable

log = get_logger("supervisor")


@dataclass
class Attempt:
    id: int
    number: int
    argv: tuple[str, ...]
    handle: TrainerHandle | None
    started_at: float


@dataclass
class Supervisor(Rescue):
    config: GuardianConfig
    store: Store
    run_id: str
    command: tuple[str, ...]  # the user's command, as given
    cwd: Path
    env: Mapping[str, str]
    control: TrainerControl
    clock: Clock
    # called right after each state is committed (tests kill the guardian here: chaos tests)
    after_commit: Callable[[str], None] = lambda state: None
    # sends an alert straight to the notifiers, bypassing the store (Dispatcher.announce)
    announce: Callable[[Alert], None] = lambda alert: None

    def __post_init__(self) -> None:
        self.folder = RunFolder(self.config.home.resolve() / "runs" / self.run_id)
        self.files = self._run_files(1)
        first = self.files.prepare(self.command)
        self.rollouts_are_users = first.rollout_dir_is_users
        self.checkpoint_dir = first.checkpoint_dir
        self.guardian = Guardian(
            config=self.config,
            store=self.store,
            run_id=self.run_id,
            metrics=self._metrics_file(first.metrics_path),
            clock=self.clock,
            rollouts=RolloutDir(first.rollout_dir),
            checkpoints_dir=self.checkpoint_dir,
            close_on_clear=self.config.mode != "enforce",
            trainer_alive=self._trainer_alive,
        )
        self.attempt: Attempt | None = None
        self._advised: set[int] = set()
        self.exit_code: int | None = None
        self.busy = False  # the last tick saw something move (a line, a transition, an intervention state to act in)
        self._store_wait = StoreWait(limit_s=self.config.store.outage_wait_s)
        self._stopped_in_outage: int | None = None  # the attempt the guardian stopped while the store was down

    def _metrics_file(self, path: Path) -> MetricsFile:
        limits = self.config.sources
        return MetricsFile(path, max_keys=limits.max_keys_per_step, max_line_bytes=limits.max_line_bytes)

    def _trainer_alive(self) -> bool | None:
        if self.attempt is None or self.attempt.handle is None:
            return None
        return self.control.is_running(self.attempt.handle)

    # -- start or re-attach -----------------------------------------------------------------------
    def start(self) -> None:
        """Launch attempt 1 of a new run, or pick up a run this store already knows."""
        latest = self.store.latest_attempt(self.run_id)
        if latest is None:
            files = self.files.prepare(self.command)
            self._launch(files.argv, files.env)
            return
        for attempt in self.store.attempts(self.run_id)[:-1]:
            dumps = self._rollouts_of(attempt.number, stored_argv(attempt.command) or self.command)
            self.guardian.rebuild(self._metrics_file(Path(attempt.metrics_path)), dumps)
        argv = stored_argv(latest.command) or self.command
        handle = attach_attempt(self.control, self.folder, latest.number, argv=argv)
        self.attempt = Attempt(latest.id, latest.number, argv, handle, self.clock())
        stored = self.store.latest_step_of_attempt(latest.id)
        self.guardian.switch_attempt(
            latest.id,
            self._metrics_file(Path(latest.metrics_path)),
            self._rollouts_of(latest.number, argv),
            judged_through=stored,
        )
        log.warning(event("run_attached", {"run": self.run_id, "attempt": latest.number, "through_step": stored}))

    # -- one pass ---------------------------------------------------------------------------------
    def tick(self) -> int | None:
        """One pass; returns the exit code once the run is over, else None."""
        # the exit status first: a trainer that ended before this poll has written its last lines already,
        # so a crash is dated at the step it really reached
        exit_status = self._exit_status()
        moved = self.guardian.tick()
        self.busy = bool(moved.new_steps or moved.transitions or moved.bad_lines)
        if not self.guardian.store_degraded:
            try:
                code = self._tick_stored(exit_status)
            except Exception as exc:
                if not unavailable(exc):
                    raise
                self.guardian.writes.failed(exc)
            else:
                self._store_wait.update(needed=False, now=self.clock())
                return code
        return self._hold()

    def _tick_stored(self, exit_status: ExitStatus | None) -> int | None:
        active = self.store.active_intervention(self.run_id)
        if active is not None:
            # a state the guardian acts in polls at full pace; waiting for the relaunched trainer does not
            self.busy = self.busy or active.state not in (State.RESUMING, State.PROBATION)
            self._drive(active)
            return self.exit_code
        given_up = self._given_up()
        if given_up is not None:
            self._stop_trainer(reason="gave up")
            return EXIT_GAVE_UP
        incident = self._incident_needing_action(exit_status)
        if incident is not None:
            self._act_on(incident)
            if self.config.mode == "enforce":
                return self.exit_code
        if exit_status is None or (self.config.mode == "enforce" and not exit_status.ok):
            return None
        # the trainer ended and nothing is left to do: enforce mode finished its job; observe and advise
        # report an unhealthy run (exit 3) as replay and watch do, and so does a rescue left unproven
        self._sweep_strays()
        self._finish_attempt(exit_status)
        self.store.set_run_status(self.run_id, "finished")
        unproven = [i.id for i in self.store.interventions(self.run_id) if i.state == State.UNRESOLVED.value]
        log.info(
            event(
                "run_finished",
                {"run": self.run_id, "last_step": self.guardian.history.last_step, "trainer": exit_status.describe()},
            )
        )
        if unproven:
            log.critical(event("run_unresolved", {"run": self.run_id, "interventions": unproven}))
        return EXIT_UNHEALTHY if incident is not None or unproven else 0

    # -- the store unavailable -------------------------------------------------------------------
    def _hold(self) -> int | None:
        """Guard from memory while the store refuses writes (see the module docstring): stop a collapsing
        trainer (enforce), start nothing; give up once no trainer has run for ``outage.STORE_WAIT_S``."""
        running = self._trainer_alive() is True
        if stop_while_store_down(mode=self.config.mode, running=running, collapsing=self._collapsing()):
            assert self.attempt is not None
            self._halt_trainer(reason="collapsing while the store is unavailable: the rescue waits for the store")
            self._stopped_in_outage, running = self.attempt.id, False
        now = self.clock()
        if not self._store_wait.update(needed=not running, now=now):
            return None
        error = self.guardian.writes.error or "unknown error"
        return self.cannot_continue(
            cause=f"the store has refused writes for {self._store_wait.waited(now):.0f}s with no trainer running "
            f"(the rescue or the end of the run must be stored first): {error}",
            fix=f"{outage_fix(error, self.store.url)}; then guardian run --attach {self.run_id} (it re-reads the "
            "metrics files: what the store missed is recorded then)",
        )

    def cannot_continue(self, *, cause: str, fix: str) -> int:
        """Give up guarding (see ``guardian.outage``): one line with the cause, the trainer's fate and the fix."""
        running = self._trainer_alive() is True
        fate = trainer_fate(mode=self.config.mode, running=running, collapsing=self._collapsing())
        trainer = {"none": "not running", "leave": "left running, UNGUARDED"}.get(fate, "stopped: it was collapsing")
        if fate == "stop":
            try:
                self._halt_trainer(reason="the guardian cannot continue")
            except Exception as exc:  # the line below still goes out, with what happened
                trainer = f"still running, UNGUARDED: stopping it failed ({exc})"
        log.critical(
            event("guardian_cannot_continue", {"run": self.run_id, "cause": cause, "trainer": trainer, "fix": fix})
        )
        self.announce(cannot_continue_alert(self.run_id, cause=cause, trainer=trainer, fix=fix))
        return EXIT_ERROR

    def _collapsing(self) -> bool:
        """Whether a critical finding stands on a step the current attempt logged."""
        steps = self.guardian.attempt_steps
        first = min(steps) if steps else None
        return first is not None and any(
            f.severity == Severity.CRITICAL and f.step is not None and f.step >= first
            for f in self.guardian.tracker.latest.values()
        )

    # -- deciding ---------------------------------------------------------------------------------
    def _exit_status(self) -> ExitStatus | None:
        if self.attempt is None or self.attempt.handle is None:
            return None
        return self.control.exit_status(self.attempt.handle)

    def _incident_needing_action(self, exit_status: ExitStatus | None) -> IncidentView | None:
        open_critical = [
            i
            for i in self.store.list_incidents(self.run_id, limit=1000)
            if i.is_open and i.severity == Severity.CRITICAL
        ]
        # a trainer this guardian stopped while the store was down did not crash: its incident explains it
        stopped_here = self.attempt is not None and self.attempt.id == self._stopped_in_outage
        crashed = exit_status is not None and not exit_status.ok and not (stopped_here and open_critical)
        if exit_status is not None and crashed and not any(i.check == CRASH for i in open_critical):
            step = self.guardian.history.last_step
            tail = _last_lines(self.attempt.handle.stdout_path) if self.attempt and self.attempt.handle else ""
            finding = Finding(
                CRASH,
                Severity.CRITICAL,
                step,
                f"trainer ended: {exit_status.describe()}" + (f": {tail.splitlines()[-1]}" if tail else ""),
                step,
                {"exit_code": exit_status.exit_code, "signal": exit_status.signal, CRASH_OUTPUT_EVIDENCE: tail},
            )
            crash = self.store.open_incident(self.run_id, finding, self.clock())
            self.store.add_finding(
                self.run_id, self.attempt.id if self.attempt else None, finding, self.clock(), crash.id
            )
            log.error(
                event(
                    "incident_opened",
                    {"run": self.run_id, "incident": crash.id, "check": CRASH, "message": finding.message},
                )
            )
            open_critical.append(crash)
        if not open_critical:
            return None
        return min(open_critical, key=lambda i: (i.onset_step if i.onset_step is not None else math.inf, i.id))

    def _act_on(self, incident: IncidentView) -> None:
        kind = Kind.RESTART if incident.check in RESTART_CHECKS else Kind.REMEDIATE
        ladder = self.config.remediation.ladders.get(incident.check, ())
        if self.config.mode == "observe":
            return
        if self.config.mode == "advise":
            if incident.id not in self._advised:
                self._advised.add(incident.id)
                log.warning(
                    event(
                        "advice",
                        {
                            "run": self.run_id,
                            "incident": incident.id,
                            "check": incident.check,
                            "action": self._describe_plan(incident, kind),
                        },
                    )
                )
            return
        checks = {i.id: i.check for i in self.store.list_incidents(self.run_id, limit=1000)}
        past = [
            PastIntervention(
                i.incident_id, checks.get(i.incident_id, ""), Kind(i.kind), i.rung, State(i.state), i.target_step
            )
            for i in self.store.interventions(self.run_id)
        ]
        budget = self.config.intervention.restart_budget if kind is Kind.RESTART else self.config.intervention.budget
        plan = plan_intervention(
            incident_id=incident.id,
            check=incident.check,
            kind=kind,
            past=past,
            budget=budget,
            ladder_length=len(ladder) or 1,
        )
        plan = self._skip_idle_rungs(plan, ladder) if kind is Kind.REMEDIATE and ladder else plan
        now = self.clock()
        iv = self.store.create_intervention(
            self.run_id,
            incident.id,
            kind=kind.value,
            rung=plan.rung,
            from_attempt_id=self.attempt.id if self.attempt else None,
            now=now,
        )
        self.after_commit(State.DETECTED.value)
        log.error(
            event(
                "intervention",
                {
                    "run": self.run_id,
                    "intervention": iv.number,
                    "incident": incident.id,
                    "check": incident.check,
                    "kind": kind.value,
                    "plan": plan.reason,
                },
            )
        )
        if plan.give_up or (kind is Kind.REMEDIATE and not ladder):
            reason = plan.reason if plan.give_up else f"no remediation ladder for {incident.check}"
            self._give_up(iv, reason)
            return
        self._commit(iv, State.STOPPING, detail={"plan": plan.reason, "exclude_steps": sorted(plan.exclude_steps)})
        self._drive(self.store.active_intervention(self.run_id) or iv)

    def _skip_idle_rungs(self, plan: Plan, ladder: Sequence[Rung]) -> Plan:
        """Climb past rungs that would relaunch the run's config unchanged."""
        if plan.give_up:
            return plan
        try:
            rung = first_effective_rung(
                self._current_argv(), ladder, plan.rung, self._run_files(self._next_attempt_number())
            )
        except (PatchError, ValueError):
            return plan  # the patch step refuses it with the reason
        if rung == plan.rung:
            return plan
        idle = ", ".join(r.name for r in ladder[plan.rung : rung])
        why = f"{plan.reason}; {idle} would change nothing in this run: rung {rung + 1} of {len(ladder)}"
        return dataclasses.replace(plan, rung=rung, reason=why)

    def _describe_plan(self, incident: IncidentView, kind: Kind) -> str:
        target = self._target(incident, frozenset(), 0)
        if target is None:
            return "give up: no healthy checkpoint at or before the onset"
        if kind is Kind.RESTART:
            return f"restart from {target.path} with the same config"
        ladder = self.config.remediation.ladders.get(incident.check, ())
        if not ladder:
            return "alert only: no remediation ladder"
        files = self._run_files(0)
        rung = ladder[first_effective_rung(self._current_argv(), ladder, 0, files)]
        plan = plan_patch(self._current_argv(), rung, resume_from=target.path, run_files=files)
        return f"roll back to step {target.step} and relaunch: {' '.join(plan.argv)}"

    # -- the trainer process and its attempts (used by the rescue) ------------------------------------
    def _given_up(self) -> InterventionView | None:
        return next((i for i in self.store.interventions(self.run_id) if i.state == State.GAVE_UP.value), None)

    def _stop_trainer(self, *, reason: str) -> None:
        if self.attempt is None or self.attempt.handle is None:
            return
        self._halt_trainer(reason=reason)
        self._finish_attempt(self.control.exit_status(self.attempt.handle))

    def _stop_policy(self) -> StopPolicy:
        ic = self.config.intervention
        return StopPolicy(ic.stop_sigint_s, ic.stop_sigterm_s, ic.stop_sigkill_s)

    def _halt_trainer(self, *, reason: str) -> None:
        """Stop the trainer's processes (nothing is stored: also while the store is unavailable)."""
        if self.attempt is None or self.attempt.handle is None:
            return
        result = self.control.stop(self.attempt.handle, self._stop_policy())
        log.warning(
            event(
                "trainer_stopped",
                {
                    "run": self.run_id,
                    "attempt": self.attempt.number,
                    "reason": reason,
                    "signals": ",".join(result.signals_sent) or "none",
                    "gone": result.gone,
                },
            )
        )
        if not result.gone:
            who = f"pids {', '.join(map(str, result.survivors))}" if result.survivors else "its process group"
            raise RuntimeError(
                f"trainer {self.attempt.handle.pgid}: {who} survived SIGKILL; refusing to relaunch (never two "
                "trainers at once). They are likely stuck in the kernel (D state: GPU driver, NFS): kill -9 them "
                f"or reboot the node, then guardian run --attach {self.run_id}"
            )

    def _sweep_strays(self) -> None:
        """The trainer ended by itself: what it left running outside its process group (a ``setsid`` child, a
        daemon; found by the trainer marker) is stopped in enforce mode, as a stop would, so nothing of the run
        outlives it; observe and advise never touch a process, they name the leftovers."""
        if self.attempt is None or self.attempt.handle is None:
            return
        fields: dict[str, object] = {"run": self.run_id, "attempt": self.attempt.number}
        if self.config.mode != "enforce":
            left = strays.find(str(self.attempt.handle.exit_file))
            if left:
                fix = "stop them: kill " + " ".join(map(str, left))
                log.warning(event("strays_after_exit", {**fields, "pids": ",".join(map(str, left)), "fix": fix}))
            return
        result = self.control.stop(self.attempt.handle, self._stop_policy())
        if result.strays or result.signals_sent or result.survivors:
            fields |= {
                "signals": ",".join(result.signals_sent) or "none",
                "pids": ",".join(map(str, result.strays)) or "none",
                "stopped": "yes" if not result.survivors else "no",
            }
            if result.survivors:
                fields["survivors"] = ",".join(map(str, result.survivors))
                fields["fix"] = "they survived SIGKILL (D state?): kill -9 them or reboot the node"
            log.warning(event("strays_after_exit", fields))

    def _finish_attempt(self, status: ExitStatus | None) -> None:
        if self.attempt is None:
            return
        self.store.end_attempt(self.attempt.id, exit_code=status.exit_code if status else None, now=self.clock())

    def _start(self, attempt_id: int, number: int, argv: Sequence[str], extra_env: Mapping[str, str]) -> None:
        handle = launch_attempt(
            self.control, self.folder, number, argv=argv, env=self.env, extra_env=extra_env, cwd=self.cwd
        )
        self.attempt = Attempt(attempt_id, number, tuple(argv), handle, self.clock())
        self.guardian.switch_attempt(
            attempt_id, self._metrics_file(self.folder.metrics(number)), self._rollouts_of(number, argv)
        )

    def _launch(self, argv: Sequence[str], extra_env: Mapping[str, str]) -> None:
        number = self._next_attempt_number()
        attempt = self.store.start_attempt(
            self.run_id, metrics_path=str(self.folder.metrics(number)), now=self.clock(), command=list(argv)
        )
        self._start(attempt.id, attempt.number, argv, extra_env)

    def _reattach(self, iv: InterventionView) -> None:
        """RESUMING after a guardian restart: the attempt row exists; launch it unless it already was."""
        assert iv.to_attempt_id is not None and iv.plan is not None
        attempt = next(a for a in self.store.attempts(self.run_id) if a.id == iv.to_attempt_id)
        self._start(attempt.id, attempt.number, stored_argv(attempt.command), stored_env(iv.plan["env"]))

    def _launched_at(self, attempt_id: int | None) -> float | None:
        current = self.attempt
        if current is None or current.id != attempt_id or current.handle is None:
            return None
        return current.started_at

    def _next_attempt_number(self) -> int:
        latest = self.store.latest_attempt(self.run_id)
        return (latest.number if latest else 0) + 1

    def _run_files(self, number: int) -> RunFiles:
        return RunFiles(self.folder.metrics(number), self.folder.rollouts(number), self.cwd, self.command)

    def _rollouts_of(self, number: int, argv: Sequence[str]) -> RolloutDir:
        """Attempt ``number``'s rollout dumps: its own folder, or the folder the user's command names."""
        return RolloutDir(self._run_files(number).prepare(argv).rollout_dir)

    def _current_argv(self) -> tuple[str, ...]:
        return self.attempt.argv if self.attempt is not None else self.command


def _last_lines(path: Path, limit: int = 2048) -> str:
    """The end of the trainer's output (the crash text), at most ``limit`` bytes."""
    try:
        with path.open("rb") as handle:
            handle.seek(max(path.stat().st_size - limit, 0))
            return handle.read().decode("utf-8", errors="replace").strip()
    except OSError:
        return ""
