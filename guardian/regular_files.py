"""Opening a file to read it without ever blocking: a FIFO, device, socket or symlink loop where a file was
expected is refused (``NotRegularFile``). The sources' tails, the config and the report read every file they did
not write through ``open_regular``."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path
from typing import BinaryIO


class NotRegularFile(OSError):
    """The path names something other than a regular file (a FIFO, a device, a socket) or a symlink loop; the
    message names the path and what it is."""


def kind_of(mode: int) -> str:
    """What a non-regular file is, for a person: ``a FIFO``, ``a character device``..."""
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symlink"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def not_regular(path: Path, mode: int) -> NotRegularFile:
    return NotRegularFile(errno.EINVAL, f"{kind_of(mode)}, not a regular file", str(path))


def _loop(path: Path) -> NotRegularFile:
    return NotRegularFile(errno.ELOOP, "a symlink loop", str(path))


def open_regular(path: Path) -> BinaryIO:
    """Open the regular file ``path`` for reading, unbuffered, without ever blocking.

    Raises ``FileNotFoundError``/``NotADirectoryError`` when it names nothing, ``IsADirectoryError`` for a folder,
    ``NotRegularFile`` for a FIFO, a device, a socket or a symlink loop (checked before the open, so a device is
    never opened, and again on the open file, which ``O_NONBLOCK`` made return at once even for a FIFO put there in
    between), other ``OSError``s as ``open`` raises them.
    """
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
            raise not_regular(path, st.st_mode)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not isinstance(exc, NotRegularFile):
            raise _loop(path) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise not_regular(path, st.st_mode)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


def regular_file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be read as a regular file (``a FIFO, not a regular file``, ``a symlink loop``), or None:
    a regular file, a folder (its own error when opened), or nothing there (yet). Other ``OSError``s are raised."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symlink loop"
        raise
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return None
    return f"{kind_of(st.st_mode)}, not a regular file"
