"""Whether a process still runs, by its pid: the trainer ``guardian watch --pid`` follows, a stray being stopped.

``os.kill(pid, 0)``: ESRCH means gone, EPERM that it exists. A zombie counts as exited (``/proc/PID/stat`` where
there is one), since where PID 1 reaps nothing an orphan's zombie can outlive it.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
EXITED_STATES = ("Z", "X")  # zombie, dead


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = (PROC / str(pid) / "stat").read_text(encoding="utf-8", errors="replace")
    except OSError:  # no /proc here, or the process ended in between: trust the signal
        return True
    fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
    return not fields or fields[0] not in EXITED_STATES
