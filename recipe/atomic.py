"""Writing a file so that a reader sees the old one or the new one, never half of one. The files are data for
others (verl's parquet, a corpus, an evaluation's results): they get the mode ``open()`` would give them (0644
under the usual umask), not the temporary file's owner-only one."""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def umask() -> int:
    """The process's umask: read where Linux tells it (``/proc/self/status``), else set and put back."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    current = os.umask(0o077)
    os.umask(current)
    return current


def _temporary(path: Path) -> Path:
    """An empty temporary file beside ``path``, with the mode ``open()`` would give ``path``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~umask())
    finally:
        os.close(fd)
    return Path(tmp)


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path in ``path``'s folder to write; on success it replaces ``path`` (``os.replace``), on any error
    it is removed and ``path`` is left as it was. The folder is created if missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def replacing_pair(first: Path, second: Path) -> Iterator[tuple[Path, Path]]:
    """Temporary paths for two files that belong together (verl's val and train), in their folders. On success
    ``first`` is replaced, then ``second``; if replacing ``second`` fails, the old ``first`` is put back (it was
    kept as a hard link), so an error anywhere leaves the old pair (or no pair) and removes the temporary files.

    Not atomic to a reader or a crash: between the two renames ``first`` is new and ``second`` old. A target that
    is a folder is refused before either is touched (``os.replace`` would fail on it only for the second)."""
    made: list[Path] = []
    try:
        for path in (first, second):
            path.parent.mkdir(parents=True, exist_ok=True)
            made.append(_temporary(path))
        yield made[0], made[1]
        for path in (first, second):
            if path.is_dir():
                raise IsADirectoryError(errno.EISDIR, f"{path} is a folder, not a file", str(path))
        backup: Path | None = None
        if os.path.lexists(first):
            backup = first.parent / f".{first.name}.{os.getpid()}.old"
            backup.unlink(missing_ok=True)
            os.link(first, backup, follow_symlinks=False)
            made.append(backup)
        os.replace(made[0], first)
        try:
            os.replace(made[1], second)
        except BaseException:
            if backup is not None:
                os.replace(backup, first)
            else:
                first.unlink(missing_ok=True)
            raise
    finally:
        for tmp in made:
            tmp.unlink(missing_ok=True)
