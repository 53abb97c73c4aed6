"""The rescue's ports on one machine: the trainer as a local process group per attempt, the run's checkpoint
directory, and the planner that patches the run's own command (verl's Hydra config)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from guardian.actions import strays
from guardian.actions.launcher import RunFolder, attach_attempt, launch_attempt
from guardian.actions.patch import PatchPlan, RunFiles, crash_restart_plan, first_effective_rung, plan_patch
from guardian.actions.process import ExitStatus, StopPolicy, TrainerControl, TrainerHandle
from guardian.checkpoints.pinning import restore_pin, set_aside_pins
from guardian.checkpoints.quarantine import quarantine_after, quarantine_all, quarantine_dumps_after
from guardian.checkpoints.scan import CheckpointError
from guardian.checkpoints.target import resume_path_for
from guardian.config import GuardianConfig
from guardian.faults import fault_fields
from guardian.ladder import Rung
from guardian.logs import event, get_logger
from guardian.rescue.ports import Launched
from guardian.states import Kind, Mode
from guardian.store import AttemptView, ConfigChange, StateDetail, Store, StoredPlan

log = get_logger("supervisor")
OUTPUT_TAIL_BYTES = 2048  # how much of a crashed trainer's output its incident keeps


class StopFailedError(RuntimeError):
    """Processes of the trainer survived SIGKILL: the guardian refuses to relaunch (never two trainers at once)."""


@dataclass
class Attempt:
    """The trainer launch this guardian follows."""

    id: int
    number: int
    argv: tuple[str, ...]
    handle: TrainerHandle | None
    started_at: float


@dataclass
class LocalTrainer:
    """``TrainerPort`` for a trainer launched as a local process group (``guardian.actions.process``)."""

    config: GuardianConfig
    store: Store
    run_id: str
    control: TrainerControl
    folder: RunFolder
    env: Mapping[str, str]
    cwd: Path
    clock: Callable[[], float]
    attempt: Attempt | None = None
    stopped_in_outage: int | None = None  # the attempt this guardian stopped while the store refused writes

    # -- what the snapshot reads ----------------------------------------------------------------------
    def alive(self) -> bool | None:
        if self.attempt is None or self.attempt.handle is None:
            return None
        return self.control.is_running(self.attempt.handle)

    def exit_status(self) -> ExitStatus | None:
        if self.attempt is None or self.attempt.handle is None:
            return None
        return self.control.exit_status(self.attempt.handle)

    def launched_at(self) -> float | None:
        """When the followed trainer was launched (or attached to); None without one."""
        return self.attempt.started_at if self.attempt is not None and self.attempt.handle is not None else None

    def argv(self, default: Sequence[str]) -> tuple[str, ...]:
        """The current attempt's command (``default`` before any launch)."""
        return self.attempt.argv if self.attempt is not None else tuple(default)

    # -- launching -------------------------------------------------------------------------------------
    def launch(self, attempt: AttemptView, plan: StoredPlan) -> Launched:
        return self.start(attempt.id, attempt.number, plan.argv, plan.env)

    def start(self, attempt_id: int, number: int, argv: Sequence[str], extra_env: Mapping[str, str]) -> Launched:
        handle = launch_attempt(
            self.control, self.folder, number, argv=argv, env=self.env, extra_env=extra_env, cwd=self.cwd
        )
        self.attempt = Attempt(attempt_id, number, tuple(argv), handle, self.clock())
        return Launched(attempt_id, number, tuple(argv))

    def attach(self, attempt: AttemptView, argv: Sequence[str]) -> None:
        """Follow the trainer an earlier guardian launched for ``attempt`` (a handle even when it is gone: how it
        ended is read from its exit file)."""
        handle = attach_attempt(self.control, self.folder, attempt.number, argv=argv)
        self.attempt = Attempt(attempt.id, attempt.number, tuple(argv), handle, self.clock())

    # -- stopping --------------------------------------------------------------------------------------
    def stop(self, *, reason: str) -> None:
        if self.attempt is None or self.attempt.handle is None:
            return
        self.halt(reason=reason)
        self._record_end(self.control.exit_status(self.attempt.handle))

    def stop_policy(self) -> StopPolicy:
        ic = self.config.intervention
        return StopPolicy(ic.stop_sigint_s, ic.stop_sigterm_s, ic.stop_sigkill_s)

    def halt(self, *, reason: str) -> None:
        """Stop the trainer's processes (nothing is stored: also while the store is unavailable)."""
        if self.attempt is None or self.attempt.handle is None:
            return
        result = self.control.stop(self.attempt.handle, self.stop_policy())
        fields = {
            "run": self.run_id,
            "attempt": self.attempt.number,
            "reason": reason,
            "signals": ",".join(result.signals_sent) or "none",
            "gone": result.gone,
        }
        log.warning(event("trainer_stopped", fields))
        if not result.gone:
            who = f"pids {', '.join(map(str, result.survivors))}" if result.survivors else "its process group"
            raise StopFailedError(
                f"trainer {self.attempt.handle.pgid}: {who} survived SIGKILL; refusing to relaunch (never two "
                "trainers at once). They are likely stuck in the kernel (D state: GPU driver, NFS): kill -9 them "
                f"or reboot the node, then guardian run --attach {self.run_id}"
            )

    def halt_in_outage(self, *, reason: str) -> None:
        """Stop a collapsing trainer while the store refuses writes; its bad exit is then no crash."""
        self.halt(reason=reason)
        self.stopped_in_outage = self.attempt.id if self.attempt is not None else None

    def finish(self, status: ExitStatus) -> None:
        self._sweep_strays()
        self._record_end(status)

    def _sweep_strays(self) -> None:
        """The trainer ended by itself: what it left running outside its process group (a ``setsid`` child, a
        daemon; found by the trainer marker) is stopped in enforce mode, as a stop would, so nothing of the run
        outlives it; observe and advise never touch a process, they name the leftovers."""
        if self.attempt is None or self.attempt.handle is None:
            return
        fields: dict[str, object] = {"run": self.run_id, "attempt": self.attempt.number}
        if Mode(self.config.mode) is not Mode.ENFORCE:
            left = strays.find(str(self.attempt.handle.exit_file))
            if left:
                fix = "stop them: kill " + " ".join(map(str, left))
                log.warning(event("strays_after_exit", {**fields, "pids": ",".join(map(str, left)), "fix": fix}))
            return
        result = self.control.stop(self.attempt.handle, self.stop_policy())
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

    def _record_end(self, status: ExitStatus | None) -> None:
        if self.attempt is not None:
            exit_code = status.exit_code if status else None
            self.store.end_attempt(self.attempt.id, exit_code=exit_code, now=self.clock())

    def output_tail(self) -> str:
        if self.attempt is None or self.attempt.handle is None:
            return ""
        path = self.attempt.handle.stdout_path
        try:
            with path.open("rb") as handle:
                handle.seek(max(path.stat().st_size - OUTPUT_TAIL_BYTES, 0))
                return handle.read().decode("utf-8", errors="replace").strip()
        except FileNotFoundError:
            return ""  # the trainer never wrote a line


@dataclass
class LocalCheckpoints:
    """``CheckpointPort`` over the run's checkpoint directory (``trainer.default_local_dir``)."""

    run_id: str
    checkpoint_dir: Path
    dumps_dir: Callable[[], Path | None]  # the user's rollout dump dir, when the attempts share it; else None
    copy_min_free_bytes: int  # a restore that must copy (hard links refused) leaves this much free

    def restore_pinned(self, step: int) -> StateDetail:
        result = restore_pin(self.checkpoint_dir, step, min_free_bytes=self.copy_min_free_bytes)
        if result.mode is None:
            return {}
        fields = {"run": self.run_id, "step": step, "from": result.pinned, "mode": result.mode.value}
        if result.set_aside is not None:
            fields["set_aside"] = result.set_aside
        if result.copied_because:
            fields["why"] = result.copied_because
        log.warning(event("pin_restored", fields))
        return {"restored_from": str(result.pinned), "restore_mode": result.mode.value}

    def quarantine_after(self, step: int, incident_id: int) -> list[int]:
        moved = [m.step for m in quarantine_after(self.checkpoint_dir, step, incident_id).moved]
        self._set_aside_pins(incident_id, after_step=step)
        return moved

    def quarantine_all(self, incident_id: int) -> list[int]:
        moved = [m.step for m in quarantine_all(self.checkpoint_dir, incident_id).moved]
        self._set_aside_pins(incident_id, after_step=None)
        return moved

    def _set_aside_pins(self, incident_id: int, *, after_step: int | None) -> None:
        """The abandoned branch's pins go with its checkpoints: the resumed run saves those steps again."""
        steps = set_aside_pins(self.checkpoint_dir, incident_id, after_step=after_step)
        if steps:
            fields = {"run": self.run_id, "incident": incident_id, "steps": ",".join(map(str, steps))}
            log.warning(event("pins_set_aside", fields))

    def set_aside_dumps(self, after_step: int, incident_id: int) -> StateDetail:
        """Each attempt has its own dump dir unless the run's own command names one: then the abandoned
        branch's dumps are moved aside before the resume rewrites them."""
        path = self.dumps_dir()
        if path is None:
            return {}
        try:
            moved = quarantine_dumps_after(path, after_step, incident_id)
        except (CheckpointError, OSError) as exc:
            log.error(event("dumps_not_kept", {"run": self.run_id, "dir": path, **fault_fields(exc)}))
            return {"dumps_kept": False}
        return {"dumps_quarantined": list(moved)} if moved else {}


@dataclass
class LocalPlanner:
    """``PlannerPort``: patches the current attempt's command with the configured ladders."""

    config: GuardianConfig
    current_argv: Callable[[], tuple[str, ...]]
    next_run_files: Callable[[], RunFiles]  # the files of the attempt the plan would launch

    def plan(self, kind: Kind, check: str, rung: int, resume_from: str | None) -> StoredPlan:
        files = self.next_run_files()
        if kind is Kind.RESTART:
            return stored_plan(crash_restart_plan(self.current_argv(), resume_from=resume_from, run_files=files))
        remedy = self.config.remediation.rung(check, rung)
        if remedy is None:
            raise ValueError(f"no rung {rung + 1} in the remediation ladder for {check}")
        return stored_plan(plan_patch(self.current_argv(), remedy, resume_from=resume_from, run_files=files))

    def first_effective_rung(self, ladder: Sequence[Rung], start: int) -> int:
        return first_effective_rung(self.current_argv(), ladder, start, self.next_run_files())


def stored_plan(plan: PatchPlan) -> StoredPlan:
    return StoredPlan(
        argv=plan.argv,
        env=dict(plan.files.env),
        diff=tuple(ConfigChange(k, b, a) for k, b, a in plan.diff),
        notes=plan.notes,
        resume_from=plan.resume_from,
        resume_path=resume_path_for(plan.resume_from) if plan.resume_from else None,
        rung=plan.rung,
        optimizer_reset=plan.optimizer_reset,
    )
