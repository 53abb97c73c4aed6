"""Atomic file writes: readers see the old content or the whole new content, also after a power cut.

Temporary file in the same folder, fsync, ``os.replace``, fsync of the folder. The temporary file is owner-only,
so a file is private unless its writer passes ``mode=for_others()`` (0644 under umask 022)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def umask() -> int:
    """The process's umask: read where Linux tells it (``/proc/self/status``), else set and put back."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    current = os.umask(0o077)  # another thread creating a file meanwhile gets it owner-only: the safe side
    os.umask(current)
    return current


def for_others() -> int:
    """The mode of a file others read: read-write for all less the umask, as ``open()`` gives (0644 under 022)."""
    return 0o666 & ~umask()


def fsync_dir(path: Path) -> None:
    """Make renames in ``path`` durable (best effort where the platform refuses to fsync a folder)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` atomically; the temporary file never outlives a failure. ``mode``: the new
    file's permissions (default: the temporary file's, owner-only: state and anything that may hold a secret;
    ``for_others()`` for a file meant to be read by others)."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            if mode is not None:
                os.fchmod(out.fileno(), mode)
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
