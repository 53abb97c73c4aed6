"""verl checkpoint folders: ``{default_local_dir}/global_step_N/`` and the tracker file
``latest_checkpointed_iteration.txt`` (facts §3.1; the tracker is written last, after the folder)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from guardian.history.timeline import valid_step

TRACKER_FILE = "latest_checkpointed_iteration.txt"
STEP_DIR = re.compile(r"^global_step_(\d+)$")


@dataclass(frozen=True, slots=True)
class CheckpointDir:
    step: int
    path: Path


def scan_checkpoints(root: Path) -> list[CheckpointDir]:
    """The ``global_step_N`` folders under ``root``, by step; none when ``root`` does not exist."""
    try:
        entries = list(root.iterdir())
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        match = STEP_DIR.match(entry.name)
        if match and valid_step(step := int(match.group(1))) and entry.is_dir():
            found.append(CheckpointDir(step, entry.resolve()))
    return sorted(found, key=lambda c: c.step)


def resumable(folder: Path) -> bool:
    """Whether verl can resume from ``folder``: its ``actor/`` is there. verl's retention
    (``trainer.max_actor_ckpt_to_keep``) deletes ``global_step_N/actor`` and leaves the folder with its
    ``data.pt`` (facts §3.3), so a folder that exists is not enough."""
    return (folder / "actor").is_dir()


def read_tracker(root: Path) -> int | None:
    """The step the tracker file names, or None when it is missing or unreadable."""
    try:
        text = (root / TRACKER_FILE).read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return int(text) if text.isascii() and text.isdigit() and valid_step(int(text)) else None
