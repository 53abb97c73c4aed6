"""verl checkpoint folders: ``{default_local_dir}/global_step_N/`` and ``latest_checkpointed_iteration.txt``.

A step folder counts only under the exact name verl writes (``global_step_`` and canonical ASCII decimal); any other
``global_step_*`` entry is left alone with one warning; a symlinked step folder counts by its own path. Every entry is
checked for its kind without following a symlink (``entry_kind``); a wrong kind is a ``CheckpointError`` naming the
path. Why: docs/decisions/0015-checkpoint-folder-names-and-kinds.md.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from guardian.core import valid_step
from guardian.logs import event, get_logger

TRACKER_FILE: Final = "latest_checkpointed_iteration.txt"
# the names verl writes (f"global_step_{step}"); match with fullmatch
STEP_DIR: Final = re.compile(r"global_step_(0|[1-9][0-9]*)", re.ASCII)
TRACKER_MAX_BYTES: Final = 4096  # verl writes a step number; anything longer is no tracker of its
log = get_logger("checkpoints")
_warned: set[tuple[str, str]] = set()  # (dir, name) of the odd step folder names said once already


class CheckpointError(RuntimeError):
    """A checkpoint-dir operation refused; the message names the path and what to do."""


@dataclass(frozen=True, slots=True)
class CheckpointDir:
    step: int
    path: Path


def step_of(name: str) -> int | None:
    """The step of a folder named exactly as verl names it (``global_step_<N>``, N canonical); None for any other
    name."""
    match = STEP_DIR.fullmatch(name)
    if match is None:
        return None
    step = int(match.group(1))
    return step if valid_step(step) else None


def scan_checkpoints(root: Path) -> list[CheckpointDir]:
    """The ``global_step_N`` folders under ``root``, by step, each by its own path (a symlink is not resolved);
    none when ``root`` does not exist. Other ``global_step_*`` names are warned about once and left out."""
    try:
        entries = list(root.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    base = Path(os.path.abspath(root))
    found = []
    for entry in entries:
        step = step_of(entry.name)
        if step is None:
            if entry.name.startswith("global_step_"):
                _warn_odd_name(base, entry.name)
            continue
        if entry.is_dir():
            found.append(CheckpointDir(step, base / entry.name))
    return sorted(found, key=lambda c: c.step)


def _warn_odd_name(root: Path, name: str) -> None:
    if (str(root), name) in _warned:
        return
    _warned.add((str(root), name))
    fields = {
        "dir": root,
        "name": ascii(name)[1:-1],  # Unicode digits and a newline shown as escapes: what is really there
        "why": "not a name verl writes (global_step_ and the step without leading zeros, ASCII digits only): "
        "never a rollback target nor moved; rename or remove it by hand if it is a checkpoint",
    }
    log.warning(event("checkpoint_name_ignored", fields))


def resumable(folder: Path) -> bool:
    """Whether verl can resume from ``folder``: its ``actor/`` is there. verl's retention
    (``trainer.max_actor_ckpt_to_keep``) deletes ``global_step_N/actor`` and leaves the folder with its
    ``data.pt`` (facts §3.3), so a folder that exists is not enough."""
    return (folder / "actor").is_dir()


Kind = Literal["folder", "regular file", "symlink", "FIFO", "socket", "device", "entry"]


def entry_kind(path: Path) -> Kind | None:
    """What ``path`` itself is (a symlink is not followed); None when there is nothing."""
    try:
        return kind_of(os.lstat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return None


def kind_of(mode: int) -> Kind:
    """The kind of entry an ``st_mode`` stands for, in words."""
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISREG(mode):
        return "regular file"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "entry"


def wrong_kind(path: Path, found: str, wanted: Literal["folder", "regular file"], what: str) -> CheckpointError:
    """The one refusal for an entry of the checkpoint dir that is not what the guardian keeps there."""
    fix = (
        "the guardian never follows a symlink it did not make: remove the link (what it points to is left alone)"
        if found == "symlink"
        else "move it out of the checkpoint dir (the guardian never deletes it)"
    )
    return CheckpointError(f"{path} is a {found}, not a {wanted}: the guardian keeps {what} there; {fix}, then retry")


def read_tracker(root: Path) -> int | None:
    """The step the tracker file names, or None when it is missing or holds no step number. Never blocks: a FIFO,
    a device or a folder in its place is refused (``CheckpointError``) without opening it."""
    path = root / TRACKER_FILE
    try:
        before = os.stat(path)  # verl would follow a symlink to its tracker; a FIFO is refused before any open
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not stat.S_ISREG(before.st_mode):
        kind: str = kind_of(before.st_mode)
        if entry_kind(path) == "symlink":
            kind = f"symlink to a {kind}"
        raise CheckpointError(
            f"{path} is a {kind}, not a regular file: verl's tracker is a file holding the step number; move it out "
            "of the checkpoint dir (the guardian never deletes it), then retry"
        )
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the stat above
            raise CheckpointError(f"{path} is not a regular file (it changed while read); retry")
        raw = os.read(fd, TRACKER_MAX_BYTES + 1)
    finally:
        os.close(fd)
    text = raw.decode("utf-8", errors="replace").strip()
    if len(raw) > TRACKER_MAX_BYTES or not (text.isascii() and text.isdigit()):
        return None
    return int(text) if valid_step(int(text)) else None
