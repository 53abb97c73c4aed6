"""Rollback on disk: pick the target checkpoint, quarantine the abandoned branch, undo a quarantine.

verl's ``resume_mode=auto`` follows ``latest_checkpointed_iteration.txt``, not the newest folder, and a
tracker naming a missing folder silently restarts training from scratch (facts §3.4, gotcha 6). After a
``resume_path`` to an older step the tracker still names the abandoned newer step until the next save.
So a rollback moves every newer ``global_step_M`` aside (never deletes: a human may want it back) and
points the tracker at the kept step. Everything here is idempotent and crash-safe: the tracker is
rewritten first (atomically), so at every crash point it names a folder that exists; re-running finishes
the moves. The trainer must be stopped first (two writers on one checkpoint dir is the caller's bug).
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from guardian.atomic import fsync_dir, write_atomically
from guardian.sources.checkpoints import TRACKER_FILE, read_tracker, scan_checkpoints

QUARANTINE_DIR = ".guardian-quarantine"
_QUARANTINED = re.compile(r"^global_step_(\d+)(?:\.dup(\d+))?$")
_INCIDENT = re.compile(r"^incident-(\d+)$")


class CheckpointError(RuntimeError):
    """A rollback file operation refused; the message names the path and what to do."""


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
    if not re.fullmatch(r"global_step_\d+", os.path.basename(text)):
        raise CheckpointError(f"{checkpoint_path}: not a verl checkpoint folder (its name must be global_step_<N>)")
    return text


def write_tracker(ckpt_dir: Path, step: int) -> None:
    """Atomically set ``latest_checkpointed_iteration.txt`` to ``step`` (verl's format: digits, no newline)."""
    write_atomically(ckpt_dir / TRACKER_FILE, str(step).encode())


def move_no_overwrite(source: Path, dest: Path) -> None:
    """os.rename (same filesystem, atomic); never copy+delete, never overwrite: ``CheckpointError`` instead."""
    if dest.exists():
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
    while dest.exists():
        n += 1
        dest = folder / f"{name}.dup{n}"
    return dest


def quarantine_after(
    ckpt_dir: Path, keep_step: int, incident_id: int, *, allow_newer_than_tracker: bool = False
) -> QuarantineResult:
    """Move every ``global_step_M`` (M > keep_step) into ``.guardian-quarantine/incident-<id>/`` and point the
    tracker at ``keep_step``. Re-running finishes an interrupted call; a name already in quarantine is kept
    and the newcomer gets a ``.dupN`` suffix. Refuses when keep_step's folder is missing, and when it is newer
    than the tracker (verl writes the tracker after the folder: such a folder may be a half-written save)."""
    if not ckpt_dir.is_dir():
        raise CheckpointError(f"checkpoint dir {ckpt_dir} is not a directory (check trainer.default_local_dir)")
    keep = ckpt_dir / f"global_step_{keep_step}"
    if not keep.is_dir():
        raise CheckpointError(f"rollback target {keep} does not exist; choose another checkpoint")
    tracker_before = read_tracker(ckpt_dir)
    if tracker_before is not None and tracker_before < keep_step and not allow_newer_than_tracker:
        raise CheckpointError(
            f"{keep} is newer than the tracker ({ckpt_dir / TRACKER_FILE} says {tracker_before}): it may be an "
            "unfinished save; roll back to a step <= the tracker, or pass allow_newer_than_tracker after checking it"
        )
    if tracker_before != keep_step:
        write_tracker(ckpt_dir, keep_step)  # first: every crash point below leaves a tracker that resolves
    folder = ckpt_dir / QUARANTINE_DIR / f"incident-{incident_id}"
    moved = []
    for ckpt in scan_checkpoints(ckpt_dir):
        if ckpt.step <= keep_step:
            continue
        folder.mkdir(parents=True, exist_ok=True)
        source = ckpt_dir / f"global_step_{ckpt.step}"
        dest = free_name(folder, source.name)
        move_no_overwrite(source, dest)
        moved.append(MovedCheckpoint(ckpt.step, source, dest))
    if moved:
        fsync_dir(folder)
        fsync_dir(ckpt_dir)
    return QuarantineResult(incident_id, keep_step, tuple(moved), tracker_before, keep_step)


def quarantine_all(ckpt_dir: Path, incident_id: int) -> QuarantineResult:
    """Move every ``global_step_M`` and the tracker into quarantine, for a restart from scratch (no healthy
    checkpoint before the onset): the new branch's saves must not overwrite the abandoned branch's folders in
    place, and a later ``resume_mode=auto`` must not follow the old tracker. Re-running finishes the job."""
    if not ckpt_dir.is_dir():
        return QuarantineResult(incident_id, 0, (), None, None)
    tracker_before = read_tracker(ckpt_dir)
    folder = ckpt_dir / QUARANTINE_DIR / f"incident-{incident_id}"
    moved = []
    for ckpt in scan_checkpoints(ckpt_dir):
        folder.mkdir(parents=True, exist_ok=True)
        source = ckpt_dir / f"global_step_{ckpt.step}"
        dest = free_name(folder, source.name)
        move_no_overwrite(source, dest)
        moved.append(MovedCheckpoint(ckpt.step, source, dest))
    tracker = ckpt_dir / TRACKER_FILE
    if tracker.exists():
        folder.mkdir(parents=True, exist_ok=True)
        move_no_overwrite(tracker, free_name(folder, TRACKER_FILE))
    if moved or tracker_before is not None:
        fsync_dir(folder)
        fsync_dir(ckpt_dir)
    return QuarantineResult(incident_id, 0, tuple(moved), tracker_before, None)


def quarantine_dumps_after(dump_dir: Path, keep_step: int, incident_id: int) -> tuple[int, ...]:
    """Move the rollout dumps ``{step}.jsonl`` of steps > keep_step into ``.guardian-quarantine/incident-<id>/``
    of the dump dir: a resumed run rewrites those steps' dumps, and the abandoned branch's dumps are the
    evidence behind the decision to abandon it (a replay of that branch needs them). For a dump dir the
    run's own command names (the guardian gives every attempt its own otherwise). Idempotent; returns the
    steps moved."""
    if not dump_dir.is_dir():
        return ()
    folder = dump_dir / QUARANTINE_DIR / f"incident-{incident_id}"
    moved = []
    for entry in sorted(dump_dir.iterdir()):
        stem, _, ext = entry.name.rpartition(".")
        if ext != "jsonl" or not stem.isdigit() or int(stem) <= keep_step or not entry.is_file():
            continue
        folder.mkdir(parents=True, exist_ok=True)
        move_no_overwrite(entry, free_name(folder, entry.name))
        moved.append(int(stem))
    if moved:
        fsync_dir(folder)
        fsync_dir(dump_dir)
    return tuple(sorted(moved))


def list_quarantine(ckpt_dir: Path) -> dict[int, list[Path]]:
    """Quarantined checkpoint folders by incident id, each list sorted by step."""
    out: dict[int, list[Path]] = {}
    root = ckpt_dir / QUARANTINE_DIR
    if not root.is_dir():
        return out
    for incident in sorted(root.iterdir()):
        if (m := _INCIDENT.match(incident.name)) and incident.is_dir():
            found = [p for p in incident.iterdir() if _QUARANTINED.match(p.name) and p.is_dir()]
            out[int(m.group(1))] = sorted(found, key=_sort_key)
    return out


def _sort_key(path: Path) -> tuple[int, int]:
    m = _QUARANTINED.match(path.name)
    assert m is not None
    return int(m.group(1)), int(m.group(2) or 0)


def restore_quarantine(ckpt_dir: Path, incident_id: int) -> RestoreResult:
    """Undo ``quarantine_after``: move the folders back, set the tracker to the highest step present, remove
    the quarantine folder if empty. Checks every destination first and refuses (moving nothing) when a folder
    of that name exists. ``.dupN`` duplicates stay in quarantine and are reported."""
    folder = ckpt_dir / QUARANTINE_DIR / f"incident-{incident_id}"
    if not folder.is_dir():
        raise CheckpointError(f"nothing quarantined for incident {incident_id}: {folder} does not exist")
    entries = list_quarantine(ckpt_dir).get(incident_id, [])
    originals = [p for p in entries if ".dup" not in p.name]
    for source in originals:
        if (ckpt_dir / source.name).exists():
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
    steps = [c.step for c in scan_checkpoints(ckpt_dir)]
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
        path.rmdir()
    except OSError:
        return False
    return True
