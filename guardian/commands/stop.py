"""``guardian stop RUN``: stop a run's trainer through the guardian's own stop path, and record the run as over.

A live ``guardian run`` is told to stop guarding first (SIGTERM) and its checkpoint-dir lock is taken, so no
guardian sees the exit as a crash; then ``TrainerControl.stop`` on the attempt's recorded wrapper. Refused, nothing
touched: an unknown or finished run, a trainer not running, a Ray run, a guardian on another host, a fleet.
Why: docs/decisions/0010-guardian-stop-takes-the-lock-first.md.
"""

from __future__ import annotations

import getpass
import os
import signal
import socket
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import orjson

from guardian.actions.dirlock import LOCK_NAME, DirLockedError, UnsafeCheckpointDirError, holding
from guardian.actions.launcher import RunFolder, attach_attempt
from guardian.actions.liveness import pid_alive
from guardian.actions.process import LocalProcessControl, StopPolicy, TrainerHandle
from guardian.config import GuardianConfig
from guardian.exits import EXIT_ERROR, EXIT_OK
from guardian.logs import event, get_logger
from guardian.rescue.local import StopFailedError
from guardian.rescue.supervisor import stored_argv
from guardian.states import RunStatus
from guardian.store import AttemptView, RunView, Store

log = get_logger("stop")
GUARDIAN_EXIT_WAIT_S = 120.0  # how long its guardian may take to finish its tick and let go of the run
LOCK_POLL_S = 0.1


class StopRefusedError(RuntimeError):
    """The run cannot be stopped as asked: nothing was touched."""


@dataclass(frozen=True, slots=True)
class Holder:
    """The guardian that holds a checkpoint dir's lock, as its lock file names it."""

    run: str | None
    pid: int | None
    host: str | None


def who() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


def read_holder(checkpoint_dir: Path) -> Holder:
    """The holder line of ``checkpoint_dir``'s lock file (never through a symlink); empty fields where unreadable."""
    try:
        fd = os.open(checkpoint_dir / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return Holder(None, None, None)
    try:
        line = os.read(fd, 4096).decode(errors="replace")
    except OSError:
        line = ""
    finally:
        os.close(fd)
    fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
    pid = fields.get("pid", "")
    return Holder(fields.get("run"), int(pid) if pid.isdigit() else None, fields.get("host"))


def _argv_of(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            raw = handle.read()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.rstrip(b"\0").split(b"\0")] if raw else []


def _own_options(argv: list[str]) -> list[str]:
    """A guardian's own arguments: those before the training command's ``--``."""
    return argv[: argv.index("--")] if "--" in argv else argv


def stop_run(
    config: GuardianConfig,
    run_id: str,
    *,
    reason: str,
    wait_s: float = GUARDIAN_EXIT_WAIT_S,
    say: Callable[[str], None] = print,
) -> int:
    """``guardian stop RUN_ID``: see the module docstring. Returns the exit code."""
    with Store.open(
        config.database_url(),
        busy_timeout_s=config.store.busy_timeout_s,
        statement_timeout_s=config.store.statement_timeout_s,
    ) as store:
        try:
            return _stop(config, store, run_id, reason=reason, wait_s=wait_s, say=say)
        except StopRefusedError as exc:
            log.error(event("stop_refused", {"run": run_id, "message": str(exc)}))
            return EXIT_ERROR
        except StopFailedError as exc:
            log.error(event("stop_failed", {"run": run_id, "message": str(exc)}))
            return EXIT_ERROR


def _stop(
    config: GuardianConfig, store: Store, run_id: str, *, reason: str, wait_s: float, say: Callable[[str], None]
) -> int:
    run = _known_and_going(store, run_id)
    saved = orjson.loads(run.config_json or "{}")
    saved = saved if isinstance(saved, dict) else {}
    if saved.get("ray_address"):
        raise StopRefusedError(
            f"run {run_id}: its attempts are Ray jobs on {saved['ray_address']}, not local processes: stop its "
            "guardian (Ctrl-C), then the job (ray job stop)"
        )
    if run.checkpoints_dir is None:
        raise StopRefusedError(f"run {run_id}: no checkpoint dir recorded: it was not launched by guardian run")
    folder = RunFolder(Path(run.metrics_path))
    control = LocalProcessControl()
    attempt, handle = _running_trainer(store, run_id, folder, control)
    checkpoint_dir = Path(run.checkpoints_dir)
    with ExitStack() as held:
        try:
            held.enter_context(holding(checkpoint_dir, run_id, folder.root))
        except UnsafeCheckpointDirError as exc:
            raise StopRefusedError(str(exc)) from None
        except DirLockedError as exc:
            pid = _guardian_of(run_id, checkpoint_dir, exc)
            _stop_guarding(pid, run_id, checkpoint_dir, folder, held, wait_s)
            say(f"run {run_id}: its guardian (pid {pid}) stopped guarding; stopping its trainer")
            # its last tick may have launched an attempt: the newest one is stopped
            attempt = store.latest_attempt(run_id) or attempt
            handle = attach_attempt(control, folder, attempt.number, argv=stored_argv(attempt.command)) or handle
        started = time.monotonic()
        ic = config.intervention  # the rescue's own stop (LocalTrainer.halt): the same control, the same waits
        result = control.stop(handle, StopPolicy(ic.stop_sigint_s, ic.stop_sigterm_s, ic.stop_sigkill_s))
        if not result.gone:
            raise StopFailedError(
                f"attempt {attempt.number}'s trainer (process group {handle.pgid}): pids "
                f"{', '.join(map(str, result.survivors)) or 'of its group'} survived SIGKILL (D state?): kill -9 them "
                "or reboot the node; the run is not recorded as stopped"
            )
        ended = result.exit or control.exit_status(handle)
        store.end_attempt(attempt.id, exit_code=ended.exit_code if ended else None, now=time.time())
        stopped = {
            "by": who(),
            "reason": reason,
            "at": datetime.now(UTC).isoformat(),
            "attempt": attempt.number,
            "pgid": handle.pgid,
            "signals": list(result.signals_sent),
            "exit": ended.describe() if ended else None,
        }
        store.record_run_stop(run_id, stopped)
        seconds = time.monotonic() - started
        sent = ", ".join(result.signals_sent) or "no signal (it had just ended)"
        log.warning(event("run_stopped", {"run": run_id, **stopped, "seconds": round(seconds, 1)}))
        say(
            f"run {run_id} stopped: attempt {attempt.number}'s trainer (process group {handle.pgid}) stopped with "
            f"{sent} in {seconds:.1f}s ({ended.describe() if ended else 'exit unknown'}); recorded as over, by "
            f"{stopped['by']}: {reason}. guardian run of it answers its end; --new starts it anew"
        )
        return EXIT_OK


def _known_and_going(store: Store, run_id: str) -> RunView:
    run = store.get_run(run_id)
    if run is None:
        known = ", ".join(r.id for r in store.list_runs()[:10]) or "none"
        raise StopRefusedError(f"no run {run_id!r} in {store.url} (known runs, newest first: {known})")
    if run.status in (RunStatus.FINISHED, RunStatus.GAVE_UP):
        raise StopRefusedError(f"run {run_id} is already over ({run.status}): nothing to stop")
    return run


def _running_trainer(
    store: Store, run_id: str, folder: RunFolder, control: LocalProcessControl
) -> tuple[AttemptView, TrainerHandle]:
    """The current attempt and its trainer's handle, refused unless that trainer runs."""
    attempt = store.latest_attempt(run_id)
    if attempt is None:
        raise StopRefusedError(f"run {run_id}: no attempt recorded: no trainer to stop")
    handle = attach_attempt(control, folder, attempt.number, argv=stored_argv(attempt.command))
    if handle is None:
        raise StopRefusedError(
            f"run {run_id}: no trainer of attempt {attempt.number} is running (it was never launched by guardian run)"
        )
    if not control.is_running(handle):
        ended = control.exit_status(handle)
        how = ended.describe() if ended is not None else "exit unknown"
        raise StopRefusedError(f"run {run_id}: no trainer of attempt {attempt.number} is running (it ended: {how})")
    return attempt, handle


def _guardian_of(run_id: str, checkpoint_dir: Path, locked: DirLockedError) -> int:
    """The pid of the live ``guardian run`` of this run that holds its checkpoint dir; refused otherwise."""
    holder = read_holder(checkpoint_dir)
    if holder.pid is None or holder.run != run_id:
        raise StopRefusedError(f"run {run_id}: {locked}")
    if holder.host != socket.gethostname():
        raise StopRefusedError(
            f"run {run_id} is guarded from host {holder.host} (pid {holder.pid}): run guardian stop {run_id} there"
        )
    if not pid_alive(holder.pid):
        raise StopRefusedError(f"run {run_id}: {locked}")
    if "fleet" in _own_options(_argv_of(holder.pid)):
        raise StopRefusedError(
            f"run {run_id} is guarded by guardian fleet (pid {holder.pid}), which guards other runs too: a signal "
            "would stop every run's guardian. Remove the run from the fleet file, or stop the fleet (Ctrl-C: the "
            f"trainers go on) and then run guardian stop {run_id}"
        )
    return holder.pid


def _stop_guarding(
    pid: int, run_id: str, checkpoint_dir: Path, folder: RunFolder, held: ExitStack, wait_s: float
) -> None:
    """Tell the run's guardian to stop guarding (SIGTERM, as Ctrl-C: its trainer is left running) and take the
    checkpoint dir's lock once it has let go, held by ``held`` so that no guardian starts meanwhile."""
    log.warning(event("guardian_told_to_stop", {"run": run_id, "pid": pid, "why": "guardian stop"}))
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            held.enter_context(holding(checkpoint_dir, run_id, folder.root))
            return
        except UnsafeCheckpointDirError as exc:
            raise StopRefusedError(str(exc)) from None
        except DirLockedError:
            if time.monotonic() > deadline:
                raise StopRefusedError(
                    f"run {run_id}: its guardian (pid {pid}) was told to stop guarding and has not let go of the run "
                    f"within {wait_s:g}s; its trainer was not touched. Try again, or stop that guardian first"
                ) from None
            time.sleep(LOCK_POLL_S)
