"""Whether a process still runs, by its pid: the trainer ``guardian watch --pid`` follows, a stray being stopped.

``os.kill(pid, 0)``: ESRCH means gone, EPERM that it exists. A zombie counts as exited (``/proc/PID/stat`` where
there is one), since where PID 1 reaps nothing an orphan's zombie can outlive it.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
EXITED_STATES = ("Z", "X")  # zombie, dead
STAT_BYTES = 4096  # a /proc/PID/stat line is a few hundred bytes


def stat_fields(pid: int | str, proc: Path | str = PROC) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after "pid (comm) " - state, ppid, pgrp, ... (proc(5) fields 3 on); None
    where it cannot be read. One open and one read, no text layer: a tick may read a few hundred of them."""
    try:
        fd = os.open(f"{proc}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.read(fd, STAT_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    text = raw.decode("utf-8", errors="replace")
    return text[text.rfind(")") + 2 :].split()  # comm may hold ")" itself: the last one ends it


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = stat_fields(pid)
    # no /proc here, or the process ended in between: trust the signal
    return not fields or fields[0] not in EXITED_STATES
