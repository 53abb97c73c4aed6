"""The rollback's quarantine: every ``global_step_M`` newer than the kept step moves aside, the tracker points back.

verl's ``resume_mode=auto`` follows ``latest_checkpointed_iteration.txt``, and a tracker naming a missing folder
silently restarts training from scratch (facts §3.4): so the tracker is rewritten first (atomically), then the
newer folders move into ``.guardian-quarantine/incident-<id>/`` - never deleted, never overwritten (``.dupN``).
Idempotent and crash-safe; the trainer must be stopped first. Undoing it is ``restore``; the moves are ``writes``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from guardian.atomic import fsync_dir
from guardian.checkpoints.scan import TRACKER_FILE, CheckpointError, entry_kind, read_tracker, scan_checkpoints
from guardian.checkpoints.writes import QUARANTINE_DIR as QUARANTINE_DIR
from guardian.checkpoints.writes import check_own_folders, free_name, move_no_overwrite, own_folder, write_tracker

_QUARANTINED = re.compile(r"global_step_(0|[1-9][0-9]*)(?:\.dup([1-9][0-9]*))?", re.ASCII)
_INCIDENT = re.compile(r"incident-([0-9]+)", re.ASCII)
_DUMP = re.compile(r"(0|[1-9][0-9]*)\.jsonl", re.ASCII)  # verl's rollout dump of a step: f"{step}.jsonl"


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
            out[int(m.group(1))] = sorted(found, key=quarantine_order)
    return out


def quarantine_order(path: Path) -> tuple[int, int]:
    """(step, duplicate number) of a quarantined folder: the order it is listed and restored in."""
    m = _QUARANTINED.fullmatch(path.name)
    assert m is not None
    return int(m.group(1)), int(m.group(2) or 0)
