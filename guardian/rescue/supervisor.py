"""``guardian run``: launch the trainer, guard it, and carry out the rescue when it collapses.

Each ``tick()`` polls the run, snapshots it, and lets ``decide``/``executor`` act. Invariant: every state is
stored before its side effect and every side effect is idempotent, so ``run --attach`` after a kill finishes an
intervention exactly once. While the store refuses writes the supervisor holds (stops, never advances):
docs/decisions/0050-hold-during-store-outage.md."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from guardian.actions.launcher import RunFolder
from guardian.actions.process import ExitStatus
from guardian.actions.schedule import retention_problem
from guardian.checkpoints.pinner import Pinner
from guardian.checkpoints.view import CheckpointsView, read_checkpoints
from guardian.checks.stall import typical_step_seconds
from guardian.config import GuardianConfig
from guardian.core import Clock, Severity
from guardian.exits import EXIT_ERROR
from guardian.faults import failure_text, fault_fields, is_outage, unavailable
from guardian.incidents.tick import IncidentTick
from guardian.logs import event, get_logger
from guardian.loop.outage import CannotContinue, StoreWait, stop_while_store_down, trainer_fate
from guardian.loop.ticks import aside
from guardian.rescue.executor import Executor
from guardian.rescue.layout import RunLayout
from guardian.rescue.local import LocalTrainer
from guardian.rescue.outcome import Outcome, measure_outcome
from guardian.rescue.ports import Launched
from guardian.rescue.pruner import DumpPruner
from guardian.rescue.ray_jobs import RayJobsTrainer
from guardian.rescue.readers import AttemptReaders
from guardian.rescue.snapshot import RescueSnapshot, StandingFinding, TrainerFacts
from guardian.sources.forwarding import ForwardingWatch, dropped_fields
from guardian.states import Kind, Mode, State
from guardian.store import IncidentView, InterventionView, Store
from guardian.store.changes import StoreMemo
from guardian.store.writebehind import outage_fix

log = get_logger("supervisor")


@dataclass
class Supervisor:
    """A guarded run's loop, given its parts (``commands.compose`` builds them): each ``tick`` judges what the trainer
    logged, carries out the rescue's pass, then the pin and dump passes."""

    config: GuardianConfig
    store: Store
    clock: Clock
    layout: RunLayout
    trainer: LocalTrainer | RayJobsTrainer  # the trainer adapter: a local process group, or a Ray job, per attempt
    readers: AttemptReaders
    incident_tick: IncidentTick
    executor: Executor
    pinner: Pinner | None  # None: observe mode, or no pins kept
    pruner: DumpPruner | None  # the attempts' own rollout dumps kept under rollouts.keep_gib
    # tells the notifiers straight, bypassing the store, that the guardian gives up (commands.outlets)
    announce: Callable[[CannotContinue], None] = lambda ending: None
    busy: bool = field(default=False, init=False)  # the last tick saw something move (a line, a transition, a state)
    _forwarding: ForwardingWatch | None = field(default=None, init=False)  # the followed attempt got our arguments
    _latest: RescueSnapshot | None = field(default=None, init=False)  # the rescue pass's last snapshot (the pin pass)
    _on_disk: CheckpointsView = field(default_factory=CheckpointsView, init=False)  # the checkpoint dir this tick
    _store_wait: StoreWait = field(init=False)
    _reads: StoreMemo = field(init=False)  # the snapshot's store reads, kept while nothing was written

    def __post_init__(self) -> None:
        self._store_wait = StoreWait(limit_s=self.config.store.outage_wait_s)
        self._reads = StoreMemo(self.store.writes, self.config.store.reread_s, self.clock)

    @property
    def run_id(self) -> str:
        return self.layout.run_id

    @property
    def command(self) -> tuple[str, ...]:
        return self.layout.command

    @property
    def cwd(self) -> Path:
        return self.layout.cwd

    @property
    def folder(self) -> RunFolder:
        return self.layout.folder

    @property
    def checkpoint_dir(self) -> Path:
        return self.layout.checkpoint_dir

    # -- start or re-attach -----------------------------------------------------------------------
    def start(self) -> None:
        """Launch attempt 1 of a new run, or pick up a run this store already knows."""
        self._check_retention()
        latest = self.store.latest_attempt(self.run_id)
        if latest is None:
            files = self.layout.files.prepare(self.command)
            attempt = self.store.start_attempt(
                self.run_id,
                metrics_path=str(self.folder.metrics(1)),
                now=self.clock(),
                command=list(files.argv),
                launch=True,
            )
            self._follow(self.trainer.start(attempt.id, attempt.number, files.argv, files.env))
            return
        for attempt in self.store.attempts(self.run_id)[:-1]:
            dumps = self.readers.rollouts(attempt.number, stored_argv(attempt.command) or self.command)
            self.incident_tick.rebuild(self.readers.metrics(Path(attempt.metrics_path), attempt.number), dumps)
        argv = stored_argv(latest.command) or self.command
        self.trainer.attach(latest, argv)
        self._forwarding = self.readers.forwarding(latest.number)
        stored = self.store.latest_step_of_attempt(latest.id)
        self.incident_tick.switch_attempt(
            latest.id,
            self.readers.metrics(Path(latest.metrics_path), latest.number),
            self.readers.rollouts(latest.number, argv),
            judged_through=stored,
        )
        log.warning(event("run_attached", {"run": self.run_id, "attempt": latest.number, "through_step": stored}))

    def _check_retention(self) -> None:
        """Say so when verl's retention deletes checkpoints before they can be pinned (a warning: the run is guarded
        all the same, only its rollback targets are at risk)."""
        pins = self.config.checkpoints
        saves = self.layout.saves
        problem = retention_problem(pins.healthy_window_steps, saves.schedule.save_freq, saves.keep)
        if self.pinner is None or problem is None:
            return
        fields = {
            "run": self.run_id,
            "healthy_window_steps": pins.healthy_window_steps,
            "save_freq": saves.schedule.save_freq,
            "max_actor_ckpt_to_keep": saves.keep,
            "message": problem,
        }
        log.warning(event("healthy_window_too_wide", fields))

    def _follow(self, launched: Launched) -> None:
        """A new launch: the guard loop reads its own metrics file and rollout dumps from now on, and checks that a
        local trainer got the guardian's arguments (``sources.forwarding``)."""
        number = launched.number
        self.incident_tick.switch_attempt(
            launched.attempt_id,
            self.readers.metrics(self.folder.metrics(number), number),
            self.readers.rollouts(number, launched.argv),
            first_launch=number == 1,
        )
        self._forwarding = self.readers.forwarding(number)

    def _follow_launches(self) -> None:
        """Follow what the rescue's effects launched (a relaunch, a re-attach), in order."""
        for launched in self.executor.take_launches():
            self._follow(launched)

    def _check_forwarding(self) -> None:
        """The one error line when the followed attempt prints steps but its metrics file stays empty."""
        dropped = self._forwarding.poll() if self._forwarding is not None else None
        if dropped is not None:
            log.error(event("arguments_not_forwarded", dropped_fields(self.run_id, self.command, dropped)))

    # -- one pass ---------------------------------------------------------------------------------
    def tick(self) -> int | None:
        """One pass; returns the exit code once the run is over, else None."""
        # the exit status first: a trainer that ended before this poll has written its last lines already,
        # so a crash is dated at the step it really reached
        try:
            exit_status = self.trainer.exit_status()
        except Exception as exc:
            if not is_outage(exc):
                raise
            # the trainer's control does not answer (a Ray cluster's Jobs API): the metrics are still read and judged
            # (findings, incidents, alerts), the rescue waits, and the tick fails as an outage (outage_limit_s)
            self.incident_tick.tick(self._read_disk(), trainer_alive=None)
            raise
        moved = self.incident_tick.tick(self._read_disk(), trainer_alive=self._trainer_alive())
        self.busy = bool(moved.new_steps or moved.transitions or moved.bad_lines)
        aside(self.run_id, "forwarding", self._check_forwarding)
        if not self.incident_tick.store_degraded:
            try:
                code = self._rescue(exit_status)
            except Exception as exc:
                if not unavailable(exc):
                    raise
                self.incident_tick.writes.failed(exc)
            else:
                self._store_wait.update(needed=False, now=self.clock())
                if code is None and moved.new_steps:
                    self._pin()
                    self._prune()
                return code
        return self._hold()

    def _trainer_alive(self) -> bool | None:
        """Whether the trainer runs, for the checks' evidence; None (unknown) while its control does not answer: the
        judging of the steps read goes on, the tick reports the outage (``tick``)."""
        try:
            return self.trainer.alive()
        except Exception as exc:
            if not is_outage(exc):
                raise
            return None

    def _pin(self) -> None:
        """The pin pass after the rescue's (``checkpoints.pinner``): a side show, whose failure never fails the tick."""
        if self.pinner is not None:
            history, pinner = self.incident_tick.history, self.pinner
            # the pass's last snapshot read the incidents already: an effect after it can only have closed one (a
            # resolve), so it never says "none open" while one is
            latest, on_disk = self._latest, self._on_disk
            open_now = None if latest is None else any(i.is_open for i in latest.incidents)
            aside(
                self.run_id,
                "pins",
                lambda: pinner.run(
                    self.incident_tick.health,
                    history.last_step,
                    history.branch,
                    on_disk=on_disk,
                    incident_open=open_now,
                ),
            )

    def _prune(self) -> None:
        """The dump pass after the pin pass (``rescue.pruner``), every few steps: a side show like it."""
        pruner, latest = self.pruner, self._latest
        if pruner is not None and latest is not None and pruner.due(latest.last_step):
            g = self.incident_tick
            attempts = self.store.attempts
            aside(
                self.run_id,
                "rollouts",
                lambda: pruner.run(latest, attempts(self.run_id), g.health, g.tracker.latest.values()),
            )

    def _rescue(self, exit_status: ExitStatus | None) -> int | None:
        """The rescue's pass: the first snapshot carries the exit status read before the poll, later ones (after
        a stop or a launch) the trainer's status then."""
        first = self.snapshot(exit_status)
        active = first.active
        # a state the guardian acts in polls at full pace; waiting for the relaunched trainer does not
        self.busy = self.busy or (active is not None and active.state not in (State.RESUMING, State.PROBATION))
        unused = [first]

        def next_snapshot() -> RescueSnapshot:
            self._follow_launches()  # an effect's launch is followed before the next decision reads the attempt
            if not unused:  # after an effect, which may have moved checkpoints (a rollback, a restored pin)
                self._read_disk()
            self._latest = unused.pop() if unused else self.snapshot(self.trainer.exit_status())
            return self._latest

        try:
            return self.executor.run_pass(next_snapshot)
        finally:
            self._follow_launches()

    def snapshot(self, exit_status: ExitStatus | None) -> RescueSnapshot:
        """The run now, frozen: the guard loop's memory and the store's incidents, interventions and checkpoints."""
        store, run_id, reads = self.store, self.run_id, self._reads
        interventions = reads.read("interventions", lambda: tuple(store.interventions(run_id)))
        incidents = reads.read("incidents", lambda: tuple(store.list_incidents(run_id)))
        active = next((iv for iv in reversed(interventions) if not iv.finished), None)
        at_risk = active is not None or any(i.is_open and i.severity == Severity.CRITICAL for i in incidents)
        g, attempt = self.incident_tick, self.trainer.attempt
        return RescueSnapshot(
            now=self.clock(),
            mode=Mode(self.config.mode),
            trainer=TrainerFacts(
                attempt_id=attempt.id if attempt else None,
                launched_at=self.trainer.launched_at(),
                exit_status=exit_status,
                stopped_in_outage=attempt is not None and attempt.id == self.trainer.stopped_in_outage,
            ),
            attempt_steps=tuple(g.attempt_steps),
            last_step=g.history.last_step,
            typical_step_s=typical_step_seconds(g.history) if active and active.state is State.RESUMING else None,
            first_startup_s=g.first_startup_s,
            critical=tuple(
                StandingFinding(f.check, f.step) for f in g.tracker.latest.values() if f.severity == Severity.CRITICAL
            ),
            incidents=incidents,
            interventions=interventions,
            checkpoints=(
                replace(self._on_disk, verdicts=reads.read("checkpoints", lambda: tuple(store.checkpoints(run_id))))
                if at_risk
                else CheckpointsView()
            ),
            outcome=self._outcome(active, incidents) if active and active.state is State.PROBATION else None,
            advised=frozenset(self.executor.advised),
        )

    def _read_disk(self) -> CheckpointsView:
        """The one scan of the checkpoint dir that the verdicts, the snapshot and the pin pass read."""
        self._on_disk = read_checkpoints(self.checkpoint_dir)
        return self._on_disk

    def _outcome(self, iv: InterventionView, incidents: tuple[IncidentView, ...]) -> Outcome:
        """The probation's figures: the new branch against the rollback point, and the incident's own check."""
        check = next(i.check for i in incidents if i.id == iv.incident_id)
        own_check = None if iv.kind is Kind.RESTART else check
        resumed = bool(self.incident_tick.attempt_steps)
        return measure_outcome(
            self.incident_tick.history,
            target_step=iv.target_step or 0,
            own=self.incident_tick.tracker.latest.get(check) if own_check and resumed else None,
            own_check=own_check,
            checks=self.config.checks,
        )

    # -- the store unavailable -------------------------------------------------------------------
    def _hold(self) -> int | None:
        """Guard from memory while the store refuses writes (see the module docstring): stop a collapsing
        trainer (enforce), start nothing; give up once no trainer has run for ``outage.STORE_WAIT_S``."""
        running = self.trainer.alive() is True
        if stop_while_store_down(mode=self.config.mode, running=running, collapsing=self._collapsing()):
            self.trainer.halt_in_outage(
                reason="collapsing while the store is unavailable: the rescue waits for the store"
            )
            running = False
        now = self.clock()
        if not self._store_wait.update(needed=not running, now=now):
            return None
        error = self.incident_tick.writes.error or "unknown error"
        return self.cannot_continue(
            cause=f"the store has refused writes for {self._store_wait.waited(now):.0f}s with no trainer running "
            f"(the rescue or the end of the run must be stored first): {error}",
            fix=f"{outage_fix(error, self.store.url)}; then guardian run --attach {self.run_id} (it re-reads the "
            "metrics files: what the store missed is recorded then)",
        )

    def cannot_continue(self, *, cause: str, fix: str) -> int:
        """Give up guarding (see ``guardian.loop.outage``): one line with the cause, the trainer's fate and the fix."""
        try:
            running = self.trainer.alive() is True
        except Exception as exc:  # its control does not answer either: say so, and leave it
            log.error(event("trainer_status_unknown", {"run": self.run_id, **fault_fields(exc)}))
            running, unknown = False, f"unknown, UNGUARDED: its control does not answer ({failure_text(exc)})"
        else:
            unknown = ""
        fate = trainer_fate(mode=self.config.mode, running=running, collapsing=self._collapsing())
        trainer = unknown or {"none": "not running", "leave": "left running, UNGUARDED"}.get(
            fate, "stopped: it was collapsing"
        )
        if fate == "stop":
            try:
                self.trainer.halt(reason="the guardian cannot continue")
            except Exception as exc:  # the line below still goes out, with what happened
                trainer = f"still running, UNGUARDED: stopping it failed ({exc})"
                log.error(event("trainer_stop_failed", {"run": self.run_id, **fault_fields(exc)}), exc_info=True)
        log.critical(
            event("guardian_cannot_continue", {"run": self.run_id, "cause": cause, "trainer": trainer, "fix": fix})
        )
        self.announce(CannotContinue(self.run_id, cause=cause, trainer=trainer, fix=fix))
        return EXIT_ERROR

    def _collapsing(self) -> bool:
        """Whether a critical finding stands on a step the current attempt logged."""
        steps = self.incident_tick.attempt_steps
        first = min(steps) if steps else None
        return first is not None and any(
            f.severity == Severity.CRITICAL and f.step is not None and f.step >= first
            for f in self.incident_tick.tracker.latest.values()
        )


def stored_argv(value: object) -> tuple[str, ...]:
    """An argv as stored (JSON list)."""
    return tuple(str(a) for a in value) if isinstance(value, list | tuple) else ()
