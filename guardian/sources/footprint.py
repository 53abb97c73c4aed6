"""One look at what a step has written so far: its checkpoint folder and its validation dump (facts §3.1, §5),
which the stall check reads as a sign of life (``guardian.checks.signs``).

A look is a few ``stat`` calls, at most ``MAX_FILES`` entries, and never raises: what cannot be read is absent."""

from __future__ import annotations

import os
from pathlib import Path

from guardian.core import Footprint, Stat

MAX_FILES = 10_000


def look(checkpoints_dir: Path | None, validation_dir: Path | None, step: int) -> Footprint:
    """What lies on disk of step ``step``'s save and validation dump now."""
    folder = None if checkpoints_dir is None else checkpoints_dir / f"global_step_{step}"
    dump = None if validation_dir is None else validation_dir / f"{step}.jsonl"
    return Footprint(
        checkpoint=None if folder is None else _folder_stat(folder),
        dump=None if dump is None else _file_stat(dump),
    )


def _file_stat(path: Path) -> Stat | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return 1, st.st_size, st.st_mtime_ns


def _folder_stat(folder: Path) -> Stat | None:
    """Files, bytes and newest mtime under ``folder`` (the folders' own mtimes too: a new file shows there first)."""
    try:
        newest = folder.stat().st_mtime_ns
    except OSError:
        return None
    files = size = 0
    for root, dirs, names in os.walk(folder):
        for name in (*names, *dirs):
            try:
                st = os.stat(os.path.join(root, name), follow_symlinks=False)
            except OSError:
                continue
            newest = max(newest, st.st_mtime_ns)
            if name in names:
                files += 1
                size += st.st_size
            if files >= MAX_FILES:
                return files, size, newest
    return files, size, newest
