"""Every write the guardian makes in a shared checkpoint dir: its own folders, moves that never overwrite, the tracker.

The guardian's own folders (``.guardian-quarantine/``, ``.guardian-pinned/``) are used only as real folders, each
level checked without following a symlink; what it removes of its own goes through a folder descriptor opened with
O_NOFOLLOW. Nothing is copied, overwritten or deleted outside those folders; the tracker only ever names a step
whose folder exists. Which folders to move, and when, is the caller's (quarantine, restore, pinning).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path
from typing import Final

from guardian.atomic import write_atomically
from guardian.checkpoints.scan import TRACKER_FILE, CheckpointError, entry_kind, wrong_kind

QUARANTINE_DIR: Final = ".guardian-quarantine"
PIN_DIR: Final = ".guardian-pinned"
TRACKER_MODE: Final = 0o644  # what verl's open(..., "w") gives under the usual umask
_CREATE_FIX: Final = {PIN_DIR: ", or set checkpoints.pin_keep: 0"}
_OWN: Final = {QUARANTINE_DIR: "the checkpoints a rollback set aside", PIN_DIR: "its pinned checkpoints"}


def own_folder(root: Path, *parts: str, create: bool, error: type[CheckpointError] = CheckpointError) -> Path | None:
    """``root/part/...``, one of the guardian's own folders, each level checked without following a symlink: a
    symlink, a file or anything but a real folder is refused (``error``, naming the path) and nothing is created
    through it. ``create``: make the missing levels; else None when one is missing."""
    path = root
    for part in parts:
        path = path / part
        what = _OWN.get(part, "its own files")
        found = entry_kind(path)
        if found is None and create:
            try:
                os.mkdir(path)  # never through a symlink: mkdir refuses one, dangling or not (EEXIST)
                continue
            except FileExistsError:
                found = entry_kind(path)  # made meanwhile: judged as found
            except OSError as exc:
                fix = "make the checkpoint dir writable for the guardian" + _CREATE_FIX.get(part, "")
                raise error(f"cannot create {path}: {os_reason(exc)}; {fix}") from None
        if found is None:
            return None
        if found != "folder":
            raise error(str(wrong_kind(path, found, "folder", what)))
    return path


def check_own_folders(root: Path, *parts: str, error: type[CheckpointError] = CheckpointError) -> None:
    """Refuse (``error``) when a level of ``root/part/...`` that exists is not a real folder; creates nothing."""
    own_folder(root, *parts, create=False, error=error)


def remove_own_tree(folder: Path, name: str, *, ignore_errors: bool = True) -> None:
    """Remove ``folder/name`` and what it holds, where ``folder`` is one of the guardian's own folders: both are
    reached without following a symlink (``folder`` opened with O_NOFOLLOW, ``name`` by ``rmtree`` on that
    descriptor, which never follows links), so nothing outside ``folder`` is removed whatever was planted there.
    Best effort unless ``ignore_errors`` is False (then the first OSError is raised); ``CheckpointError`` when
    ``folder`` is not a real folder."""
    fd = open_own_folder(folder)
    try:
        shutil.rmtree(name, dir_fd=fd, ignore_errors=ignore_errors)
    finally:
        os.close(fd)


def open_own_folder(folder: Path) -> int:
    """A descriptor of ``folder`` itself (a symlink in its place is refused, not followed)."""
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        found = entry_kind(folder)
        if found is not None and found != "folder":
            raise wrong_kind(folder, found, "folder", _OWN.get(folder.name, "its own files")) from None
        raise CheckpointError(f"cannot open {folder}: {os_reason(exc)}") from None


def os_reason(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0, "")
    return f"{exc.strerror or exc}" + (f" ({name})" if name else "")


def write_tracker(ckpt_dir: Path, step: int) -> None:
    """Atomically set ``latest_checkpointed_iteration.txt`` to ``step`` (verl's format: digits, no newline), with
    verl's mode (the previous tracker's, else 0644). Refuses a step whose ``global_step_{step}`` folder does not
    exist: verl's ``resume_mode=auto`` would silently start from scratch."""
    folder = ckpt_dir / f"global_step_{step}"
    if not folder.is_dir():
        raise CheckpointError(
            f"not pointing the tracker {ckpt_dir / TRACKER_FILE} at step {step}: {folder} does not exist (verl would "
            "start from scratch); choose a step whose folder is there"
        )
    path = ckpt_dir / TRACKER_FILE
    try:
        before = os.lstat(path)
    except FileNotFoundError:
        mode = TRACKER_MODE
    else:
        mode = stat.S_IMODE(before.st_mode) if stat.S_ISREG(before.st_mode) else TRACKER_MODE
    write_atomically(path, str(step).encode(), mode=mode)


def move_no_overwrite(source: Path, dest: Path) -> None:
    """os.rename (same filesystem, atomic); never copy+delete, never overwrite: ``CheckpointError`` instead. A
    symlink at either end is renamed itself, never followed."""
    if os.path.lexists(dest):
        raise CheckpointError(f"refusing to overwrite {dest} with {source}; move one of them by hand")
    try:
        os.rename(source, dest)
    except OSError as exc:
        if exc.errno == errno.EXDEV:
            raise CheckpointError(
                f"{source} and {dest} are on different filesystems; the guardian never copies checkpoints "
                f"(make {dest.parent} a plain folder inside the checkpoint dir)"
            ) from exc
        raise


def free_name(folder: Path, name: str) -> Path:
    """``folder/name``, or ``name.dupN`` with the first N that is free: nothing set aside is ever overwritten."""
    dest, n = folder / name, 0
    while os.path.lexists(dest):
        n += 1
        dest = folder / f"{name}.dup{n}"
    return dest
