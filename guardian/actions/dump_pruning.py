"""The rollout dump files on disk: list a run's own dump folders and remove the dumps a plan names.

Only ``{step}.jsonl`` regular files directly inside the folders given are removed: never a symlink, a folder,
a quarantine folder's content or a file elsewhere. The caller passes only folders the guardian created.
Which dumps go is ``dump_retention.plan_pruning``'s call, not this module's.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from guardian.actions.dump_retention import DumpFile
from guardian.checkpoints.quarantine import QUARANTINE_DIR

_DUMP = re.compile(r"(\d{1,18})\.jsonl")


@dataclass(frozen=True, slots=True)
class Removal:
    """What a removal did: the files and bytes removed, and a line for each file that could not be."""

    files: int
    bytes: int
    failed: tuple[str, ...]


def scan_dumps(folders: Mapping[int, Path]) -> list[DumpFile]:
    """Every dump of the given folders (attempt number -> its own dump folder), the quarantined ones included (they
    count toward the cap and are never removed). A folder that does not exist yet holds none."""
    found: list[DumpFile] = []
    for attempt, folder in folders.items():
        found += _dumps_in(folder, attempt, quarantined=False)
        quarantine = folder / QUARANTINE_DIR
        if _is_real_dir(quarantine):
            for incident in sorted(quarantine.iterdir()):
                if _is_real_dir(incident):
                    found += _dumps_in(incident, attempt, quarantined=True)
    return found


def remove_dumps(files: Iterable[DumpFile], folders: Iterable[Path]) -> Removal:
    """Remove each of ``files`` that is the guardian's own, not quarantined, and a regular dump file directly in one
    of ``folders``; a file already gone counts as removed."""
    allowed = {os.path.abspath(f) for f in folders}
    count = removed = 0
    failed: list[str] = []
    for dump in files:
        path = dump.path
        if not dump.owned or dump.quarantined or os.path.abspath(path.parent) not in allowed:
            failed.append(f"{path}: not one of the guardian's own dump folders, left alone")
            continue
        if _DUMP.fullmatch(path.name) is None:
            failed.append(f"{path}: not a step dump, left alone")
            continue
        try:
            if not stat.S_ISREG(path.lstat().st_mode):
                failed.append(f"{path}: not a regular file, left alone")
                continue
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            failed.append(f"{path}: {exc.strerror or exc}")
            continue
        count += 1
        removed += dump.size
    return Removal(count, removed, tuple(failed))


def _dumps_in(folder: Path, attempt: int, *, quarantined: bool) -> list[DumpFile]:
    try:
        entries = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for entry in entries:
        match = _DUMP.fullmatch(entry.name)
        if match is None:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:  # removed meanwhile
            continue
        if stat.S_ISREG(info.st_mode):
            found.append(DumpFile(Path(entry.path), int(match.group(1)), info.st_size, attempt, quarantined))
    return found


def _is_real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False
