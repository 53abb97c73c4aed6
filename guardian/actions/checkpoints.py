"""Rollback on disk: pick the target checkpoint, quarantine the abandoned branch, undo a quarantine.

verl's ``resume_mode=auto`` follows ``latest_checkpointed_iteration.txt``, not the newest folder, and a
tracker naming a missing folder silently restarts training from scratch (facts §3.4, gotcha 6). After a
``resume_path`` to an older step the tracker still names the abandoned newer step until the next save.
So a rollback moves every newer ``global_step_M`` aside (never deletes: a human may want it back) and
points the tracker at the kept step. Everything here is idempotent and crash-safe: the tracker is
rewritten first (atomically), so at every crash point it names a folder that exists; re-running finishes
the moves. The trainer must be stopped first (two writers on one checkpoint dir is the caller's bug).

The checkpoint dir may hold what someone else put there: the guardian's own folders (``.guardian-quarantine/``
and what is under it) are used only as real folders, never through a symlink, checked before anything changes
(``own_folder``: a symlink or a file in their place is one ``CheckpointError`` naming the path), and what the
guardian removes of its own goes through a folder descriptor opened without following links
(``remove_own_tree``), so nothing outside the checkpoint dir is ever moved into, written or removed. Only folders
named exactly as verl names them (``global_step_<N>``, guardian.sources.checkpoints) are moved; the tracker is
only ever pointed at a step whose folder exists, and keeps verl's mode (0644, or what it had).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol, TypeVar

from guardian.atomic import fsync_dir, write_atomically
from guardian.sources.checkpoints import (
    TRACKER_FILE,
    entry_kind,
    read_tracker,
    scan_checkpoints,
    step_of,
    wrong_kind,
)
from guardian.sources.checkpoints import CheckpointError as CheckpointError  # raised from here too

QUARANTINE_DIR: Final = ".guardian-quarantine"
_QUARANTINED = re.compile(r"global_step_(0|[1-9][0-9]*)(?:\.dup([1-9][0-9]*))?", re.ASCII)
_INCIDENT = re.compile(r"incident-([0-9]+)", re.ASCII)
_DUMP = re.compile(r"(0|[1-9][0-9]*)\.jsonl", re.ASCII)  # verl's rollout dump of a step: f"{step}.jsonl"
TRACKER_MODE: Final = 0o644  # what verl's open(..., "w") gives under the usual umask
_CREATE_FIX: Final = {".guardian-pinned": ", or set checkpoints.pin_keep: 0"}
_OWN: Final = {QUARANTINE_DIR: "the checkpoints a rollback set aside", ".guardian-pinned": "its pinned checkpoints"}


class CheckpointLike(Protocol):
    """What rollback selection needs of a checkpoint (store.views.CheckpointView fits)."""

    @property
    def step(self) -> int: ...
    @property
    def path(self) -> str: ...
    @property
    def verdict(self) -> str: ...


C = TypeVar("C", bound=CheckpointLike)


@dataclass(frozen=True, slots=True)
class MovedCheckpoint:
    step: int
    source: Path
    dest: Path


@dataclass(frozen=True, slots=True)
class QuarantineResult:
    incident_id: int
    keep_step: int
    moved: tuple[MovedCheckpoint, ...]
    tracker_before: int | None
    tracker_after: int | None  # None: the tracker itself went to quarantine (restart from scratch)


@dataclass(frozen=True, slots=True)
class RestoreResult:
    incident_id: int
    restored: tuple[MovedCheckpoint, ...]
    left_in_quarantine: tuple[Path, ...]  # duplicates (``global_step_M.dupK``): restore by hand if wanted
    tracker_before: int | None
    tracker_after: int | None
    quarantine_removed: bool


def choose_rollback_target(
    checkpoints: Sequence[C],
    *,
    onset_step: int | None,
    detected_step: int,
    margin_steps: int,
    exclude_steps: Collection[int],
    available: Collection[int],
    skip_newest: int = 0,
) -> C | None:
    """The newest "healthy" checkpoint at or before (onset, else detection) − margin, not excluded, that a rollback
    can land on: ``available`` holds the steps verl can resume from as they are on disk, and those whose folder
    verl's retention emptied but the guardian pinned (the rollback restores them first; guardian.actions.pins).

    On a relapse the caller excludes the previous target, which moves one further back; ``skip_newest``
    skips that many more qualifying checkpoints (a rung's ``rollback_extra_checkpoints``), as far as there
    are any. None: nothing qualifies; the supervisor then restarts from scratch once
    (``trainer.resume_mode=disable``, the old branch quarantined), else gives up. It never falls back to an
    unhealthy checkpoint.
    """
    limit = (onset_step if onset_step is not None else detected_step) - margin_steps
    qualifying = sorted(
        (
            c
            for c in checkpoints
            if c.verdict == "healthy" and c.step <= limit and c.step not in exclude_steps and c.step in available
        ),
        key=lambda c: c.step,
        reverse=True,
    )
    # a rung's "further back" goes as far back as there are healthy checkpoints, never to none at all
    return qualifying[min(skip_newest, len(qualifying) - 1)] if qualifying else None


def resume_path_for(checkpoint_path: str | os.PathLike[str]) -> str:
    """Absolute ``…/global_step_N`` with no trailing slash: verl asserts 'global_step_' is in it and parses
    ``int(path.split('global_step_')[-1])``, so a trailing slash or another last component breaks resume."""
    text = os.path.abspath(os.path.expanduser(os.fspath(checkpoint_path)))
    if step_of(os.path.basename(text)) is None:
        raise CheckpointError(f"{checkpoint_path}: not a verl checkpoint folder (its name must be global_step_<N>)")
    return text


# -- the guardian's own entries in the checkpoint dir -----------------------------------------------------------
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


def quarantine_after(
    ckpt_dir: Path, keep_step: int, incident_id: int, *, allow_newer_than_tracker: bool = False
) -> QuarantineResult:
    """Move every ``global_step_M`` (M > keep_step) into ``.guardian-quarantine/incident-<id>/`` and point the
    tracker at ``keep_step``. Re-running finishes an interrupted call; a name already in quarantine is kept
    and the newcomer gets a ``.dupN`` suffix. Refuses when keep_step's folder is missing, and when it is newer
    than the tracker (verl writes the tracker after the folder: such a folder may be a half-written save), and
    - before changing anything - when the quarantine folders are not real folders (a planted symlink, a file)."""
    if not ckpt_dir.is_dir():
        raise CheckpointError(f"checkpoint dir {ckpt_dir} is not a directory (check trainer.default_local_dir)")
    keep = ckpt_dir / f"global_step_{keep_step}"
    if not keep.is_dir():
        raise CheckpointError(f"rollback target {keep} does not exist; choose another checkpoint")
    parts = (QUARANTINE_DIR, f"incident-{incident_id}")
    check_own_folders(ckpt_dir, *parts)
    tracker_before = read_tracker(ckpt_dir)
    if tracker_before is not None and tracker_before < keep_step and not allow_newer_than_tracker:
        raise CheckpointError(
            f"{keep} is newer than the tracker ({ckpt_dir / TRACKER_FILE} says {tracker_before}): it may be an "
            "unfinished save; roll back to a step <= the tracker, or pass allow_newer_than_tracker after checking it"
        )
    if tracker_before != keep_step:
        write_tracker(ckpt_dir, keep_step)  # first: every crash point below leaves a tracker that resolves
    moved = []
    folder: Path | None = None
    for ckpt in scan_checkpoints(ckpt_dir):
        if ckpt.step <= keep_step:
            continue
        folder = folder or own_folder(ckpt_dir, *parts, create=True)
        assert folder is not None
        source = ckpt_dir / f"global_step_{ckpt.step}"
        dest = free_name(folder, source.name)
        move_no_overwrite(source, dest)
        moved.append(MovedCheckpoint(ckpt.step, source, dest))
    if folder is not None:
        fsync_dir(folder)
        fsync_dir(ckpt_dir)
    return QuarantineResult(incident_id, keep_step, tuple(moved), tracker_before, keep_step)


def quarantine_all(ckpt_dir: Path, incident_id: int) -> QuarantineResult:
    """Move every ``global_step_M`` and the tracker into quarantine, for a restart from scratch (no healthy
    checkpoint before the onset): the new branch's saves must not overwrite the abandoned branch's folders in
    place, and a later ``resume_mode=auto`` must not follow the old tracker. Re-running finishes the job."""
    if not ckpt_dir.is_dir():
        return QuarantineResult(incident_id, 0, (), None, None)
    parts = (QUARANTINE_DIR, f"incident-{incident_id}")
    check_own_folders(ckpt_dir, *parts)
    tracker_before = read_tracker(ckpt_dir)
    moved = []
    folder: Path | None = None
    for ckpt in scan_checkpoints(ckpt_dir):
        folder = folder or own_folder(ckpt_dir, *parts, create=True)
        assert folder is not None
        source = ckpt_dir / f"global_step_{ckpt.step}"
        dest = free_name(folder, source.name)
        move_no_overwrite(source, dest)
        moved.append(MovedCheckpoint(ckpt.step, source, dest))
    tracker = ckpt_dir / TRACKER_FILE
    if os.path.lexists(tracker):
        folder = folder or own_folder(ckpt_dir, *parts, create=True)
        assert folder is not None
        move_no_overwrite(tracker, free_name(folder, TRACKER_FILE))
    if folder is not None:
        fsync_dir(folder)
        fsync_dir(ckpt_dir)
    return QuarantineResult(incident_id, 0, tuple(moved), tracker_before, None)


def quarantine_dumps_after(dump_dir: Path, keep_step: int, incident_id: int) -> tuple[int, ...]:
    """Move the rollout dumps ``{step}.jsonl`` of steps > keep_step into ``.guardian-quarantine/incident-<id>/``
    of the dump dir: a resumed run rewrites those steps' dumps, and the abandoned branch's dumps are the
    evidence behind the decision to abandon it (a replay of that branch needs them). For a dump dir the
    run's own command names (the guardian gives every attempt its own otherwise). Idempotent; returns the
    steps moved. The quarantine folders are used only as real folders (``CheckpointError`` otherwise)."""
    if not dump_dir.is_dir():
        return ()
    parts = (QUARANTINE_DIR, f"incident-{incident_id}")
    check_own_folders(dump_dir, *parts)
    folder: Path | None = None
    moved = []
    for entry in sorted(dump_dir.iterdir()):
        match = _DUMP.fullmatch(entry.name)
        if match is None or int(match.group(1)) <= keep_step or not entry.is_file():
            continue
        folder = folder or own_folder(dump_dir, *parts, create=True)
        assert folder is not None
        move_no_overwrite(entry, free_name(folder, entry.name))
        moved.append(int(match.group(1)))
    if folder is not None:
        fsync_dir(folder)
        fsync_dir(dump_dir)
    return tuple(sorted(moved))


def list_quarantine(ckpt_dir: Path) -> dict[int, list[Path]]:
    """Quarantined checkpoint folders by incident id, each list sorted by step. Only real folders are read (a
    symlink in the place of the quarantine is refused: ``CheckpointError``; one in place of an incident folder
    is no incident of the guardian's)."""
    out: dict[int, list[Path]] = {}
    root = own_folder(ckpt_dir, QUARANTINE_DIR, create=False)
    if root is None:
        return out
    for incident in sorted(root.iterdir()):
        if (m := _INCIDENT.fullmatch(incident.name)) and entry_kind(incident) == "folder":
            found = [p for p in incident.iterdir() if _QUARANTINED.fullmatch(p.name) and p.is_dir()]
            out[int(m.group(1))] = sorted(found, key=_sort_key)
    return out


def _sort_key(path: Path) -> tuple[int, int]:
    m = _QUARANTINED.fullmatch(path.name)
    assert m is not None
    return int(m.group(1)), int(m.group(2) or 0)


def restore_quarantine(ckpt_dir: Path, incident_id: int) -> RestoreResult:
    """Undo ``quarantine_after``: move the folders back, set the tracker to the highest step present, remove
    the quarantine folder if empty. Checks every destination first and refuses (moving nothing) when a folder
    of that name exists, when the quarantine is not a real folder, and when the tracker cannot be read.
    ``.dupN`` duplicates stay in quarantine and are reported."""
    folder = own_folder(ckpt_dir, QUARANTINE_DIR, f"incident-{incident_id}", create=False)
    if folder is None:
        where = ckpt_dir / QUARANTINE_DIR / f"incident-{incident_id}"
        raise CheckpointError(f"nothing quarantined for incident {incident_id}: {where} does not exist")
    entries = list_quarantine(ckpt_dir).get(incident_id, [])
    originals = [p for p in entries if ".dup" not in p.name]
    for source in originals:
        if os.path.lexists(ckpt_dir / source.name):
            raise CheckpointError(
                f"cannot restore {source}: {ckpt_dir / source.name} exists (a newer save of that step?); "
                "the guardian never overwrites checkpoints - move one of them aside by hand, then retry"
            )
    tracker_before = read_tracker(ckpt_dir)
    restored = []
    for source in originals:
        move_no_overwrite(source, ckpt_dir / source.name)
        restored.append(MovedCheckpoint(_sort_key(source)[0], source, ckpt_dir / source.name))
    fsync_dir(ckpt_dir)
    steps = [c.step for c in scan_checkpoints(ckpt_dir)]  # verl's names only: each one a folder that exists
    tracker_after = max(steps) if steps else tracker_before
    if tracker_after is not None and tracker_after != tracker_before:
        write_tracker(ckpt_dir, tracker_after)
    removed = _rmdir_if_empty(folder)
    if removed:
        _rmdir_if_empty(folder.parent)
    left = tuple(p for p in entries if p not in originals)
    return RestoreResult(incident_id, tuple(restored), left, tracker_before, tracker_after, removed)


def _rmdir_if_empty(path: Path) -> bool:
    try:
        path.rmdir()  # never follows a symlink; refuses a folder that holds anything
    except OSError:
        return False
    return True
