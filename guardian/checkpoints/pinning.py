"""Pinned checkpoints on disk: healthy ``global_step_N`` folders kept out of verl's retention.

A pin is ``<ckpt>/.guardian-pinned/global_step_N/`` with every file hard-linked (a copy where links are refused,
only with enough free space), built under a temporary name and renamed, so a pin is always complete.
Only the guardian's own ``.guardian-pinned/`` folders are ever removed (through ``remove_own_tree``); a folder in a
restore's way goes to quarantine. Errors are ``PinError`` naming the path. Why: docs/decisions/0014-checkpoint-pins.md.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from guardian.atomic import fsync_dir
from guardian.checkpoints.scan import CheckpointError, entry_kind, step_of
from guardian.checkpoints.writes import PIN_DIR as PIN_DIR
from guardian.checkpoints.writes import (
    QUARANTINE_DIR,
    free_name,
    move_no_overwrite,
    open_own_folder,
    os_reason,
    own_folder,
    remove_own_tree,
)
from guardian.states import PinMode

TEMP_PREFIX: Final = ".tmp-"  # the guardian's unfinished work inside .guardian-pinned/
RESTORED_OVER: Final = "before-restore"  # .guardian-quarantine/ subfolder for what stood in a restore's way
# a hard link the filesystem refuses (rather than a checkpoint that is gone or a folder we may not write): copy
LINK_REFUSED: Final = frozenset({errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP})
GIB: Final = 1 << 30


class PinError(CheckpointError):
    """A pin, release or restore could not be done; the message names the path and what to do."""


class CopyRefused(PinError):
    """Hard links were refused and a copy would leave too little space free."""


@dataclass(frozen=True, slots=True)
class PinResult:
    step: int
    source: Path
    pinned: Path
    mode: PinMode
    bytes_added: int  # what the pin adds on disk now: 0 for hard links, the size for a copy
    files: int
    copied_because: str = ""  # why hard links were refused (a copy), empty for links
    adopted: bool = False  # the pinned folder was already in place (a guardian killed before recording it)


@dataclass(frozen=True, slots=True)
class RestoreResult:
    step: int
    pinned: Path
    target: Path
    mode: PinMode | None  # None: the original was intact, nothing was restored
    set_aside: Path | None  # what stood at the target (the folder verl's retention emptied), moved to quarantine
    copied_because: str = ""


@dataclass(frozen=True, slots=True)
class _Entry:
    """One file, folder or symlink of a folder tree, relative to its root (a symlink is kept as a symlink)."""

    relative: Path
    kind: Literal["file", "dir", "link"]
    size: int = 0

    @property
    def file(self) -> bool:
        return self.kind == "file"


def pin_root(ckpt_dir: Path) -> Path:
    return ckpt_dir / PIN_DIR


def pinned_path(ckpt_dir: Path, step: int) -> Path:
    return pin_root(ckpt_dir) / f"global_step_{step}"


def pinned_steps(ckpt_dir: Path) -> dict[int, Path]:
    """The pinned folders on disk, by step (temporary folders are no pins; nothing behind a symlink is one)."""
    root = pin_root(ckpt_dir)
    if entry_kind(root) != "folder":
        return {}
    try:
        entries = list(root.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return {}
    found = {}
    for entry in entries:
        step = step_of(entry.name)
        if step is not None and entry_kind(entry) == "folder":
            found[step] = entry
    return dict(sorted(found.items()))


def _pin_root(ckpt_dir: Path, *, create: bool) -> Path | None:
    """``.guardian-pinned/`` as a real folder of the checkpoint dir (``PinError`` for a symlink or a file there)."""
    return own_folder(ckpt_dir, PIN_DIR, create=create, error=PinError)


# -- pin --------------------------------------------------------------------------------------------------------
def pin_checkpoint(ckpt_dir: Path, step: int, *, min_free_bytes: int) -> PinResult:
    """Pin ``global_step_{step}``: hard links (a copy where they are refused and at least ``min_free_bytes`` stay
    free), built under a temporary name and renamed to ``.guardian-pinned/global_step_{step}``. A pinned folder
    already in place is adopted. Raises ``PinError`` (``CopyRefused`` for too little space) and leaves nothing
    behind: the checkpoint vanished or changed while it was linked, a folder that cannot be written, a full disk."""
    source = ckpt_dir / f"global_step_{step}"
    dest = pinned_path(ckpt_dir, step)
    _pin_root(ckpt_dir, create=False)
    tree = _tree(source, "checkpoint")
    if entry_kind(dest) == "folder":
        return _adopt(step, source, dest, tree)
    root = _created(_pin_root(ckpt_dir, create=True))
    temp = _fresh_temp(root, f"pin-{source.name}")
    mode, because = _build_from(source, temp, tree, root, min_free_bytes)
    try:
        if _tree(source, "checkpoint") != tree:
            raise PinError(f"{source} changed while it was pinned (verl's retention deleting it?): not pinned")
        _rename_into_place(temp, dest)
    except BaseException:
        _remove_temp(temp)
        raise
    fsync_dir(root)
    size = sum(e.size for e in tree)
    return PinResult(step, source, dest, mode, size if mode is PinMode.COPY else 0, sum(e.file for e in tree), because)


def _adopt(step: int, source: Path, dest: Path, tree: list[_Entry]) -> PinResult:
    """A pinned folder the store does not know (the guardian died between the rename and its record): kept when it
    holds the checkpoint's files, refused when it holds something else."""
    pinned = _tree(dest, "pinned copy")
    if pinned != tree:
        raise PinError(
            f"{dest} exists but does not hold the files of {source}; the guardian never overwrites a pin: "
            "move it aside by hand"
        )
    files = [e for e in pinned if e.file]
    shared = [e for e in files if _same_file(source / e.relative, dest / e.relative)]
    mode = PinMode.LINK if len(shared) == len(files) else PinMode.COPY
    added = sum(e.size for e in files) - sum(e.size for e in shared)
    return PinResult(step, source, dest, mode, added, len(files), adopted=True)


# -- release ----------------------------------------------------------------------------------------------------
def release_pin(ckpt_dir: Path, step: int) -> bool:
    """Remove ``.guardian-pinned/global_step_{step}`` - the guardian's own folder, nothing else: it is renamed to a
    temporary name first, so a half-removed pin never looks like a pin. False when it was not there."""
    pinned = pinned_path(ckpt_dir, step)
    if _pin_root(ckpt_dir, create=False) is None:
        return False
    if pinned.is_symlink():
        raise PinError(f"{pinned} is a symlink, not a pin the guardian made; it is left alone: remove it by hand")
    if not pinned.is_dir():
        return False
    temp = _fresh_temp(pin_root(ckpt_dir), f"release-{pinned.name}")
    try:
        os.rename(pinned, temp)
        _remove_temp(temp, ignore_errors=False)
    except OSError as exc:
        raise PinError(
            f"cannot remove the pin {pinned}: {_reason(exc)}; what is left is in {pin_root(ckpt_dir)} (remove "
            "it by hand once the checkpoint dir is writable)"
        ) from None
    fsync_dir(pin_root(ckpt_dir))
    return True


# -- restore ----------------------------------------------------------------------------------------------------
def restore_pin(ckpt_dir: Path, step: int, *, min_free_bytes: int) -> RestoreResult:
    """Put the pinned ``global_step_{step}`` back in place for a rollback whose original verl's retention emptied:
    hard links to the pin (a copy where refused), built under a temporary name and renamed to ``global_step_N``.
    What stands there (the folder with ``data.pt`` and no ``actor/``) moves into
    ``.guardian-quarantine/before-restore/`` first. Nothing is done when the original still holds every file of
    the pin. Idempotent; raises ``PinError``."""
    pinned = pinned_path(ckpt_dir, step)
    if _pin_root(ckpt_dir, create=False) is None or entry_kind(pinned) != "folder":
        raise PinError(f"no pinned copy of step {step}: {pinned} does not exist; choose another checkpoint")
    target = ckpt_dir / f"global_step_{step}"
    tree = _tree(pinned, "pinned copy")
    if target.is_dir() and _holds(target, tree):
        return RestoreResult(step, pinned, target, None, None)
    own_folder(ckpt_dir, QUARANTINE_DIR, RESTORED_OVER, create=False, error=PinError)  # before anything is built
    temp = _fresh_temp(pin_root(ckpt_dir), f"restore-{target.name}")
    mode, because = _build_from(pinned, temp, tree, pin_root(ckpt_dir), min_free_bytes)
    set_aside = None
    try:
        if os.path.lexists(target):
            aside = _created(own_folder(ckpt_dir, QUARANTINE_DIR, RESTORED_OVER, create=True, error=PinError))
            set_aside = free_name(aside, target.name)
            try:
                move_no_overwrite(target, set_aside)
            except OSError as exc:
                raise PinError(f"cannot move {target} aside to {set_aside}: {_reason(exc)}") from None
        _rename_into_place(temp, target)
    except BaseException:
        _remove_temp(temp)
        raise
    fsync_dir(ckpt_dir)
    return RestoreResult(step, pinned, target, mode, set_aside, because)


def _holds(folder: Path, tree: list[_Entry]) -> bool:
    """Whether ``folder`` has every file of ``tree`` at its place with its size."""
    for entry in tree:
        try:
            stat = (folder / entry.relative).lstat()
        except FileNotFoundError:
            return False
        if entry.file and stat.st_size != entry.size:
            return False
    return True


# -- set aside --------------------------------------------------------------------------------------------------
def set_aside_pins(ckpt_dir: Path, incident_id: int, *, after_step: int | None) -> list[int]:
    """Move the pins of the branch a rollback abandons (steps after ``after_step``; None: every pin, a restart from
    scratch) into ``.guardian-quarantine/incident-<id>/pinned/``: the resumed run saves those steps again, and a pin
    of the old branch under the same name would be restored in their place. Moved, never deleted (it may be the
    only copy left of a checkpoint verl deleted). Idempotent; the steps moved."""
    moved = []
    parts = (QUARANTINE_DIR, f"incident-{incident_id}", "pinned")
    own_folder(ckpt_dir, *parts, create=False)  # a planted symlink or file: refused before anything moves
    _pin_root(ckpt_dir, create=False)
    folder: Path | None = None
    for step, pinned in pinned_steps(ckpt_dir).items():
        if after_step is not None and step <= after_step:
            continue
        folder = folder or _created(own_folder(ckpt_dir, *parts, create=True))
        move_no_overwrite(pinned, free_name(folder, pinned.name))
        moved.append(step)
    if folder is not None:
        fsync_dir(folder)
        fsync_dir(pin_root(ckpt_dir))
    return moved


# -- sizes ------------------------------------------------------------------------------------------------------
def held_bytes(pinned: Path) -> int:
    """The bytes only the pin keeps alive now - what releasing it would free: its files with no other name (a
    copy's every file; a hard-linked pin's files once verl deleted the original). 0 when it is gone."""
    try:
        return sum(st.st_size for st in _stats(pinned) if st.st_nlink == 1)
    except (OSError, PinError):
        return 0


def _stats(folder: Path) -> Iterator[os.stat_result]:
    for entry in _tree(folder, "pinned copy"):
        if entry.file:
            yield (folder / entry.relative).lstat()


# -- building a tree --------------------------------------------------------------------------------------------
def _tree(folder: Path, what: str) -> list[_Entry]:
    """Every file and symlink under ``folder`` (symlinks not followed), sorted; ``PinError`` when the folder is
    missing or cannot be read."""
    if not folder.is_dir():
        raise PinError(f"{what} {folder} is not there (deleted or moved meanwhile?): nothing to pin or restore")
    entries = []

    def fail(exc: OSError) -> None:
        raise exc

    try:
        for top, dirs, files in os.walk(folder, onerror=fail):
            base = Path(top)
            for name in [*dirs, *files]:
                path = base / name
                relative = path.relative_to(folder)
                if path.is_symlink():
                    entries.append(_Entry(relative, "link"))
                elif name in dirs:
                    entries.append(_Entry(relative, "dir"))
                else:
                    entries.append(_Entry(relative, "file", path.lstat().st_size))
    except FileNotFoundError as exc:
        raise PinError(f"{what} {folder} changed while it was read: {exc.filename} vanished") from None
    except OSError as exc:
        raise PinError(f"cannot read {what} {folder}: {_reason(exc)}") from None
    return sorted(entries, key=lambda e: e.relative)


def _build_from(source: Path, temp: Path, tree: list[_Entry], root: Path, min_free_bytes: int) -> tuple[PinMode, str]:
    """``source``'s tree at ``temp``: hard links, else a copy (space permitting). Leaves no ``temp`` on failure."""
    try:
        _build(source, temp, tree, _link)
        return PinMode.LINK, ""
    except _LinkRefused as refused:
        because = refused.reason
    except BaseException:
        _remove_temp(temp)
        raise
    _remove_temp(temp)
    _check_space(source, root, sum(e.size for e in tree), min_free_bytes, because)
    try:
        _build(source, temp, tree, _copy)
    except BaseException:
        _remove_temp(temp)
        raise
    return PinMode.COPY, because


class _LinkRefused(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in LINK_REFUSED:
            raise _LinkRefused(f"hard link refused: {_reason(exc)}") from None
        raise


def _copy(src: Path, dst: Path) -> None:
    shutil.copyfile(src, dst, follow_symlinks=False)
    shutil.copystat(src, dst, follow_symlinks=False)
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _build(source: Path, temp: Path, tree: list[_Entry], put: Callable[[Path, Path], None]) -> None:
    try:
        os.mkdir(temp)
        for entry in tree:  # sorted: a folder comes before what it holds
            src, dst = source / entry.relative, temp / entry.relative
            if entry.kind == "dir":
                os.mkdir(dst)
            elif entry.kind == "link":
                os.symlink(os.readlink(src), dst)
            else:
                put(src, dst)
        for folder in [*(temp / e.relative for e in tree if e.kind == "dir"), temp]:
            fsync_dir(folder)
    except FileNotFoundError as exc:
        raise PinError(f"{source} changed while it was pinned: {exc.filename} vanished; nothing was kept") from None
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise PinError(f"disk full under {temp.parent} while pinning {source}; nothing was kept") from None
        raise PinError(f"cannot pin {source} into {temp.parent}: {_reason(exc)}") from None


def _check_space(source: Path, root: Path, size: int, min_free_bytes: int, because: str) -> None:
    try:
        free = shutil.disk_usage(root).free
    except OSError as exc:
        raise PinError(
            f"not copying {source}: {because}, and the free space of {root} is unknown: {_reason(exc)}"
        ) from None
    if free - size < min_free_bytes:
        raise CopyRefused(
            f"not copying {source} ({size / GIB:.2f} GiB) into {root}: {because}, and the copy would leave "
            f"{(free - size) / GIB:.2f} GiB free, below checkpoints.copy_min_free_gib ({min_free_bytes / GIB:.2f}); "
            "free space, or keep the checkpoint dir on a filesystem that allows hard links"
        )


def _created(folder: Path | None) -> Path:
    assert folder is not None, "own_folder(create=True) returns the folder"
    return folder


def remove_leftovers(ckpt_dir: Path) -> list[str]:
    """Remove the temporary folders an interrupted pin, release or restore left in ``.guardian-pinned/`` (call it
    while this guardian holds the checkpoint dir's lock and builds nothing: none of them is in use); their names.
    ``PinError`` when ``.guardian-pinned`` is a symlink or a file: nothing is removed then."""
    root = _pin_root(ckpt_dir, create=False)
    if root is None:
        return []
    names = _temps(root, TEMP_PREFIX)
    for name in names:
        _remove_temp(root / name)
    return names


def _temps(root: Path, prefix: str) -> list[str]:
    """The names in the guardian's own ``root`` (read through a descriptor: never a folder a symlink names)."""
    try:
        fd = open_own_folder(root)
    except CheckpointError as exc:
        raise PinError(str(exc)) from None
    try:
        return sorted(name for name in os.listdir(fd) if name.startswith(prefix))
    finally:
        os.close(fd)


def _fresh_temp(root: Path, name: str) -> Path:
    """A temporary folder name for ``name`` in ``root``; what an interrupted earlier attempt left there is removed."""
    for stale in _temps(root, f"{TEMP_PREFIX}{name}-"):
        _remove_temp(root / stale)
    return root / f"{TEMP_PREFIX}{name}-{os.getpid()}"


def _remove_temp(temp: Path, *, ignore_errors: bool = True) -> None:
    """Remove one of the guardian's temporary folders (only ever a ``.tmp-*`` inside ``.guardian-pinned/``, reached
    without following a symlink)."""
    assert temp.name.startswith(TEMP_PREFIX) and temp.parent.name == PIN_DIR, temp
    try:
        remove_own_tree(temp.parent, temp.name, ignore_errors=ignore_errors)
    except CheckpointError as exc:
        raise PinError(str(exc)) from None


def _rename_into_place(temp: Path, dest: Path) -> None:
    try:
        os.rename(temp, dest)
    except OSError as exc:
        raise PinError(f"cannot move {temp} to {dest}: {_reason(exc)}") from None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


_reason = os_reason
