"""Trainer launches as the run folder records them: one ``<home>/runs/<run_id>/attempt-<k>/`` per launch.

An attempt folder holds ``metrics.jsonl`` (its own ``VERL_FILE_LOGGER_PATH``), ``stdout.log``, ``command.json``,
``overrides.txt``, ``exit.json`` (from the runner) and ``rollouts/`` unless the command names its own dump folder.
A dump folder the command names is held by one run at a time (``holding_dumps``).
Why: docs/decisions/0004-one-folder-per-attempt.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import orjson

from guardian.actions.dirlock import LOCK_NAME, DirLockedError, holding
from guardian.actions.process import TrainerControl, TrainerHandle, read_runner_start
from guardian.atomic import for_others, write_atomically
from guardian.logs import event, get_logger

log = get_logger("launcher")


@dataclass(frozen=True, slots=True)
class RunFolder:
    root: Path

    def rollouts(self, number: int) -> Path:
        return self.attempt(number) / "rollouts"

    def attempt(self, number: int) -> Path:
        return self.root / f"attempt-{number}"

    def metrics(self, number: int) -> Path:
        return self.attempt(number) / "metrics.jsonl"

    def stdout(self, number: int) -> Path:
        return self.attempt(number) / "stdout.log"

    def exit_file(self, number: int) -> Path:
        return self.attempt(number) / "exit.json"


def launch_attempt(
    control: TrainerControl,
    folder: RunFolder,
    number: int,
    *,
    argv: Sequence[str],
    env: Mapping[str, str],
    extra_env: Mapping[str, str],
    cwd: Path,
) -> TrainerHandle:
    """Launch attempt ``number``, or attach to it if an earlier guardian already launched it (its runner
    left a start record): a restarted guardian never starts a second trainer for one attempt."""
    folder.attempt(number).mkdir(parents=True, exist_ok=True)
    exit_file = folder.exit_file(number)
    existing = attach_attempt(control, folder, number, argv=argv)
    if existing is not None:
        return existing
    attempt_dir = prepare_attempt(folder, number, argv=argv, extra_env=extra_env, cwd=cwd)
    handle = control.launch(
        argv, env={**env, **extra_env}, cwd=cwd, stdout_path=folder.stdout(number), exit_file=exit_file
    )
    log.info(event("attempt_launched", {"attempt": number, "pid": handle.pid, "dir": attempt_dir}))
    return handle


def prepare_attempt(
    folder: RunFolder,
    number: int,
    *,
    argv: Sequence[str],
    extra_env: Mapping[str, str],
    cwd: Path,
    record: Mapping[str, object] | None = None,
) -> Path:
    """Attempt ``number``'s folder before its launch: what it runs (command.json, with ``record``'s fields; its
    Hydra overrides) and its empty metrics file. Returns the folder."""
    attempt_dir = folder.attempt(number)
    attempt_dir.mkdir(parents=True, exist_ok=True)
    command = {"argv": list(argv), "env": dict(extra_env), "cwd": str(cwd), **(record or {})}
    # for others to read, like the metrics file beside them (no secret: the store's URL never reaches the trainer)
    shared = for_others()
    write_atomically(attempt_dir / "command.json", orjson.dumps(command, option=orjson.OPT_INDENT_2), mode=shared)
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    write_atomically(attempt_dir / "overrides.txt", ("\n".join(overrides) + "\n").encode(), mode=shared)
    folder.metrics(number).touch()  # verl does not create the logger file's parent; the file marks the attempt
    return attempt_dir


def attach_attempt(
    control: TrainerControl, folder: RunFolder, number: int, *, argv: Sequence[str]
) -> TrainerHandle | None:
    """The running (or finished) trainer of attempt ``number`` if it was ever started, else None."""
    exit_file = folder.exit_file(number)
    record = read_runner_start(exit_file)
    if record is None:
        return None
    pid = record.runner_pid or record.pid
    handle = control.attach(
        pid, exit_file=exit_file, stdout_path=folder.stdout(number), command=argv, started_at=record.started_at
    )
    if handle is None:
        # the group is gone: keep a handle anyway so the caller can read how it ended from exit.json
        handle = TrainerHandle(
            pid=pid,
            pgid=pid,
            exit_file=exit_file,
            stdout_path=folder.stdout(number),
            started_at=record.started_at,
            command=tuple(argv),
        )
    log.info(event("attempt_attached", {"attempt": number, "pid": handle.pid}))
    return handle


@contextmanager
def holding_dumps(directory: Path, run_id: str, run_folder: Path | None = None) -> Iterator[Path]:
    """Hold the guardian lock of the rollout dump folder ``directory`` (the run's own ``trainer.rollout_data_dir``)
    for the block, as a checkpoint dir's is held (``guardian.actions.dirlock``: one lock file, gone with the
    guardian's process); yields the lock file. Raises ``DirLockedError`` naming both runs and the folder when another
    guardian (of this process too: a fleet's other run) holds it, or a trainer its guardian left running writes there.
    """
    held = ExitStack()
    try:
        lock = held.enter_context(holding(directory, run_id, run_folder))
    except DirLockedError as exc:
        if type(exc) is not DirLockedError:  # not another run's: the folder itself is unsafe (says so itself)
            raise
        other = _holder_run(directory)
        whose = f"run {other}'s" if other else "another run's"
        raise DirLockedError(
            f"run {run_id} is refused: its rollout dump folder {directory} (trainer.rollout_data_dir) is {whose} too, "
            f"and a rollback of either run would move the other's step dumps into its own quarantine. Give run "
            f"{run_id} its own trainer.rollout_data_dir ({exc})"
        ) from None
    with held:
        yield lock


def _holder_run(directory: Path) -> str | None:
    """The run named by the holder line of ``directory``'s lock file (never through a symlink), if any."""
    try:
        fd = os.open(directory / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        line = os.read(fd, 4096).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)
    fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
    return fields.get("run") or None
