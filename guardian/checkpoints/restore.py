"""Undo a quarantine (``guardian checkpoints restore RUN --incident ID``): the set-aside folders go back.

Checks every destination first and moves nothing when one is taken; the tracker ends at the highest step present.
``.dupN`` duplicates stay in quarantine and are reported. Restoring a pinned copy is ``pinning.restore_pin``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from guardian.atomic import fsync_dir
from guardian.checkpoints.quarantine import MovedCheckpoint, list_quarantine, quarantine_order
from guardian.checkpoints.scan import CheckpointError, read_tracker, scan_checkpoints
from guardian.checkpoints.writes import QUARANTINE_DIR, move_no_overwrite, own_folder, write_tracker


@dataclass(frozen=True, slots=True)
class RestoreResult:
    incident_id: int
    restored: tuple[MovedCheckpoint, ...]
    left_in_quarantine: tuple[Path, ...]  # duplicates (``global_step_M.dupK``): restore by hand if wanted
    tracker_before: int | None
    tracker_after: int | None
    quarantine_removed: bool


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
        restored.append(MovedCheckpoint(quarantine_order(source)[0], source, ckpt_dir / source.name))
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
