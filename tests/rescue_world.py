"""A run for the rescue's unit tests: a real store (SQLite in a temp dir), a manual clock, and recording ports in
place of the trainer's processes, the checkpoint folders and the planner. A test sets what the guard loop would
know (steps, findings, the trainer's exit, the probation's figures) and runs one pass at a time."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from conftest import ManualClock

from guardian.actions.launcher import RunFolder
from guardian.actions.process import ExitStatus
from guardian.checkpoints.scan import CheckpointError
from guardian.checkpoints.view import CheckpointsView
from guardian.config import GuardianConfig
from guardian.core import Finding, Severity
from guardian.ladder import Rung
from guardian.rescue.executor import Executor
from guardian.rescue.outcome import Comparison, Outcome
from guardian.rescue.ports import Launched
from guardian.rescue.snapshot import RescueSnapshot, StandingFinding, TrainerFacts
from guardian.states import Kind, Mode, State
from guardian.store import AttemptView, ConfigChange, IncidentView, InterventionView, StateDetail, Store, StoredPlan
from guardian.verl_keys import PatchError

RUN = "rescue"


class GuardianKilled(Exception):
    """Stands for SIGKILL right after a commit: the pass ends there, the store keeps what was committed."""


@dataclass
class Trainer:
    """The trainer's processes, as the rescue sees them: launches and stops are recorded."""

    world: World
    tail: str | OSError = "Traceback ...\nRuntimeError: CUDA error: an illegal memory access"
    launched: set[int] = field(default_factory=set)  # attempts whose runner started (their start record exists)

    def stop(self, *, reason: str) -> None:
        self.world.calls.append(f"stop {reason}")
        if self.world.attempt_id is not None and self.world.exit_status is None:
            self.world.exit_status = ExitStatus(None, 2)  # SIGINT

    def launch(self, attempt: AttemptView, plan: StoredPlan) -> Launched:
        if attempt.id in self.launched:  # as launcher.launch_attempt: attach, never a second trainer
            self.world.calls.append(f"attach attempt {attempt.number}")
        else:
            self.world.calls.append(f"launch attempt {attempt.number}: {' '.join(plan.argv)}")
            self.launched.add(attempt.id)
            self.world.exit_status, self.world.attempt_steps = None, []
        self.world.attempt_id, self.world.launched_at = attempt.id, self.world.clock()
        return Launched(attempt.id, attempt.number, plan.argv)

    def output_tail(self) -> str:
        if isinstance(self.tail, OSError):
            raise self.tail
        return self.tail

    def finish(self, status: ExitStatus) -> None:
        self.world.calls.append(f"finish {status.describe()}")


@dataclass
class Checkpoints:
    """The checkpoint folders (``world.saved``) and their pins (``world.pinned``), as the rescue sees them."""

    world: World
    refuse: str | None = None
    refuse_restore: str | None = None

    def restore_pinned(self, step: int) -> StateDetail:
        if self.refuse_restore:
            raise CheckpointError(self.refuse_restore)
        assert step in self.world.pinned, f"restore of step {step}, which has no pin"
        self.world.calls.append(f"restore {step} from its pin")
        self.world.saved.add(step)
        return {"restored_from": f"/ckpt/.guardian-pinned/global_step_{step}", "restore_mode": "link"}

    def quarantine_after(self, step: int, incident_id: int) -> list[int]:
        if self.refuse:
            raise CheckpointError(self.refuse)
        moved = sorted(s for s in self.world.saved if s > step)
        self.world.saved -= set(moved)
        self.world.pinned -= {s for s in self.world.pinned if s > step}  # set aside with their branch
        self.world.calls.append(f"quarantine after {step}: {moved}")
        return moved

    def quarantine_all(self, incident_id: int) -> list[int]:
        moved = sorted(self.world.saved)
        self.world.saved.clear()
        self.world.pinned.clear()
        self.world.calls.append(f"quarantine all: {moved}")
        return moved

    def set_aside_dumps(self, after_step: int, incident_id: int) -> StateDetail:
        return {}


@dataclass
class Planner:
    world: World
    refuse: str | None = None
    effective_from: int = 0  # rungs below this one change nothing in the run's config

    def plan(self, kind: Kind, check: str, rung: int, resume_from: str | None) -> StoredPlan:
        if self.refuse:
            raise PatchError(self.refuse)
        what = "same-config" if kind is Kind.RESTART else f"{check}-rung-{rung + 1}"
        resume = f"resume={resume_from}" if resume_from else "resume=disable"
        diff = () if kind is Kind.RESTART else (ConfigChange("actor.optim.lr", 1e-3, 5e-4),)
        return StoredPlan(argv=("train", what, resume), env={"VERL_FILE_LOGGER_PATH": "m.jsonl"}, diff=diff)

    def first_effective_rung(self, ladder: Sequence[Rung], start: int) -> int:
        return min(max(start, self.effective_from), len(ladder) - 1)


@dataclass
class World:
    store: Store
    home: Path
    config: GuardianConfig = field(default_factory=GuardianConfig)
    clock: ManualClock = field(default_factory=lambda: ManualClock(1000.0))
    calls: list[str] = field(default_factory=list)  # what the ports were asked to do, in order
    saved: set[int] = field(default_factory=set)  # checkpoint steps verl can resume from as they are on disk
    pinned: set[int] = field(default_factory=set)  # checkpoint steps with a pinned copy
    # what the guard loop knows
    attempt_id: int | None = None
    launched_at: float | None = None
    exit_status: ExitStatus | None = None
    stopped_in_outage: bool = False  # the guardian stopped the trainer while the store refused writes
    attempt_steps: list[int] = field(default_factory=list)
    critical: list[StandingFinding] = field(default_factory=list)
    outcome: Outcome | None = None
    first_startup_s: float | None = None  # how long the run's first launch took to its first step
    kill_after: str | None = None  # the state after whose commit the guardian "dies" (once)

    def __post_init__(self) -> None:
        self.store.ensure_run(
            RUN, name=RUN, metrics_path="m", rollouts_dir="r", checkpoints_dir="c", mode=self.config.mode, now=0.0
        )
        self.trainer, self.checkpoints, self.planner = Trainer(self), Checkpoints(self), Planner(self)
        self.executor = self.new_guardian()
        first = self.store.start_attempt(RUN, metrics_path="m1", now=0.0, command=["train"])
        self.attempt_id, self.launched_at = first.id, 0.0
        self.trainer.launched.add(first.id)

    def new_guardian(self) -> Executor:
        """A guardian started afresh on the same store and the same trainer (``guardian run --attach``)."""
        self.executor = Executor(
            self.config,
            self.store,
            RUN,
            RunFolder(self.home),
            self.clock,
            trainer=self.trainer,
            checkpoints=self.checkpoints,
            planner=self.planner,
            after_commit=self._after_commit,
        )
        return self.executor

    def restarted(self) -> None:
        """The guardian was killed and started again: it follows the run's latest attempt, attached when that
        attempt's trainer was launched (Supervisor.start), not launched yet otherwise."""
        self.new_guardian()
        latest = self.store.latest_attempt(RUN)
        assert latest is not None
        self.attempt_id = latest.id
        self.launched_at = self.clock() if latest.id in self.trainer.launched else None

    def _after_commit(self, state: str) -> None:
        if state == self.kill_after:
            self.kill_after = None
            raise GuardianKilled(state)

    # -- the run's facts ------------------------------------------------------------------------------
    def save(self, *steps: int, verdict: str = "healthy") -> None:
        for step in steps:
            self.saved.add(step)
            self.store.record_checkpoint(RUN, step=step, path=f"/ckpt/global_step_{step}", verdict=verdict, now=1.0)

    def retention_deletes(self, *steps: int, pinned: bool) -> None:
        """verl's max_actor_ckpt_to_keep emptied these checkpoints' folders; the guardian had pinned them or not."""
        self.saved -= set(steps)
        if pinned:
            self.pinned |= set(steps)

    def incident(self, check: str = "entropy_collapse", *, step: int = 40, onset: int | None = 35) -> IncidentView:
        finding = Finding(check, Severity.CRITICAL, step, f"{check} at step {step}", onset)
        return self.store.open_incident(RUN, finding, self.clock())

    def logs(self, *steps: int) -> None:
        self.attempt_steps.extend(steps)

    def proven(self, steps_after: int, *, reward: tuple[float, float] = (0.5, 0.55), healthy: bool = True) -> None:
        self.outcome = Outcome(
            target_step=0,
            newest_step=None,
            steps_after=steps_after,
            signal_check="entropy_collapse",
            signal_healthy=healthy,
            signal_message="ok" if healthy else "critical: entropy 0.01",
            reward=Comparison("critic/score/mean", reward[0], reward[1], 0.02),
            validation=None,
        )

    def snapshot(self) -> RescueSnapshot:
        steps = self.attempt_steps
        return RescueSnapshot(
            now=self.clock(),
            mode=Mode(self.config.mode),
            trainer=TrainerFacts(self.attempt_id, self.launched_at, self.exit_status, self.stopped_in_outage),
            attempt_steps=tuple(steps),
            last_step=max(steps) if steps else 40,
            typical_step_s=10.0,
            first_startup_s=self.first_startup_s,
            critical=tuple(self.critical),
            incidents=tuple(self.store.list_incidents(RUN)),
            interventions=tuple(self.store.interventions(RUN)),
            checkpoints=CheckpointsView(
                resumable=frozenset(self.saved),
                pinned=frozenset(self.pinned),
                verdicts=tuple(self.store.checkpoints(RUN)),
            ),
            outcome=self.outcome,
            advised=frozenset(self.executor.advised),
        )

    # -- driving --------------------------------------------------------------------------------------
    def tick(self) -> int | None:
        return self.executor.run_pass(self.snapshot)

    def interventions(self) -> list[InterventionView]:
        return self.store.interventions(RUN)

    def states(self, number: int = 1) -> list[State]:
        iv = next(i for i in self.interventions() if i.number == number)
        return [e.state for e in self.store.intervention_events(iv.id)]
