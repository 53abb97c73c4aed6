"""One guardian per checkpoint dir: an exclusive ``flock`` on ``<dir>/.guardian.lock`` held while a run is guarded.

The lock goes with the guardian's process (the trainer does not inherit it), so ``--attach`` can take it again.
The lock file and the guardian's own folders are opened with ``O_NOFOLLOW``: a symlink or non-folder there is refused.
On NFS flock is a safety net, not a guarantee. Why: docs/decisions/0003-one-guardian-per-checkpoint-dir.md.
"""

from __future__ import annotations

import fcntl
import os
import socket
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from guardian.actions import strays
from guardian.checkpoints.scan import CheckpointError, entry_kind, kind_of, wrong_kind
from guardian.checkpoints.writes import PIN_DIR, QUARANTINE_DIR, check_own_folders, os_reason

LOCK_NAME: Final = ".guardian.lock"
_LOCK_FLAGS: Final = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class DirLockedError(RuntimeError):
    """Another guardian guards this checkpoint dir."""


class UnsafeCheckpointDirError(DirLockedError):
    """The lock file or one of the guardian's own folders is not what the guardian keeps there (a symlink, a file
    where a folder goes, a FIFO): refused before anything is written."""


@contextmanager
def holding(directory: Path, run_id: str, run_folder: Path | None = None) -> Iterator[Path]:
    """Hold the guardian lock of ``directory`` (created if missing) for the block; yields the lock file.

    ``run_folder`` (the run's attempt folders) is recorded, so that a later guardian of another run can
    tell that this run's trainer outlived its guardian (Ctrl-C leaves it running) and refuse to start a
    second trainer on the same checkpoint dir."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_NAME
    fd = _open_lock(directory, path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "unknown"
            raise DirLockedError(
                f"checkpoint dir {directory} is guarded by another guardian ({holder}); two guardians on one "
                "checkpoint dir would roll back and quarantine under each other's trainers. Stop that guardian, "
                "or give this run its own trainer.default_local_dir (on NFS, a lock of a dead client lasts "
                "until the server's lease ends, about 90 s)"
            ) from None
        for own in (PIN_DIR, QUARANTINE_DIR):
            try:
                check_own_folders(directory, own)
            except CheckpointError as exc:
                raise UnsafeCheckpointDirError(str(exc)) from None
        _refuse_if_a_trainer_was_left(directory, os.pread(fd, 4096, 0).decode(errors="replace"), run_id)
        folder = f" folder={run_folder.resolve()}" if run_folder is not None else ""
        line = f"run={run_id} pid={os.getpid()} host={socket.gethostname()}{folder}\n".encode()
        os.pwrite(fd, line, 0)  # then cut what an older, longer holder line left: never an empty file
        os.ftruncate(fd, len(line))
        yield path
    finally:
        os.close(fd)  # releases the lock; the file stays (removing it would race a new holder)


def _open_lock(directory: Path, path: Path) -> int:
    """The lock file's descriptor: a regular file in ``directory`` itself, created if missing (0644); never
    through a symlink, never a FIFO or device (O_NONBLOCK: opening one cannot hang). ``directory`` itself may be
    a symlink (a checkpoint dir on another volume): only the entries inside it are the guardian's."""
    try:
        folder = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise UnsafeCheckpointDirError(f"cannot open checkpoint dir {directory}: {os_reason(exc)}") from None
    try:
        fd = os.open(LOCK_NAME, _LOCK_FLAGS, 0o644, dir_fd=folder)
    except OSError as exc:
        found = entry_kind(path)
        if found is not None and found != "regular file":
            raise UnsafeCheckpointDirError(str(_wrong_lock(path, found))) from None
        raise UnsafeCheckpointDirError(
            f"cannot open the lock file {path}: {os_reason(exc)}; make the checkpoint dir writable for the guardian"
        ) from None
    finally:
        os.close(folder)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # a FIFO or a device opens (O_NONBLOCK): refused all the same
        os.close(fd)
        raise UnsafeCheckpointDirError(str(_wrong_lock(path, kind_of(mode))))
    return fd


def _wrong_lock(path: Path, found: str) -> CheckpointError:
    return wrong_kind(path, found, "regular file", "its lock file (who guards this checkpoint dir)")


def _refuse_if_a_trainer_was_left(directory: Path, previous: str, run_id: str) -> None:
    """The last holder's run left a trainer running (its guardian stopped): only that run may go on."""
    fields = dict(part.split("=", 1) for part in previous.split() if "=" in part)
    folder, other = fields.get("folder"), fields.get("run")
    if not folder or other == run_id:
        return
    left = strays.find(folder, under=True)
    if left:
        raise DirLockedError(
            f"a trainer of run {other} still runs on checkpoint dir {directory} (pids {', '.join(map(str, left))}): "
            f"its guardian stopped and left it running. Re-attach with guardian run --attach {other}, or stop it "
            "first; two trainers must never write one checkpoint dir"
        )
