"""Whether the trainer process that ``guardian watch --pid PID`` follows still runs.

``os.kill(pid, 0)`` sends nothing: ESRCH means the process is gone, EPERM that it exists (another
user's). A zombie has exited too: where PID 1 reaps nothing (a container), the trainer's zombie can
outlive it, so ``/proc/PID/stat`` is read when there is one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

PROC = Path("/proc")


def pid_alive(pid: int, proc: Path = PROC) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:  # no /proc here, or the process ended in between: trust the signal
        return True
    state = stat[stat.rfind(")") + 2 :].split()[:1]
    return state not in (["Z"], ["X"])


class TrainerLiveness:
    """Sampled once per tick by the watch loop (``sample``) and read by the checks of that tick (calling
    the object: the ``Guardian.trainer_alive`` callback), so the end decision and the stall check see the
    same answer. None when no process was named."""

    def __init__(self, pid: int | None, alive: Callable[[int], bool] = pid_alive) -> None:
        self.pid = pid
        self._alive = alive
        self._last: bool | None = None

    def sample(self) -> bool | None:
        self._last = None if self.pid is None else self._alive(self.pid)
        return self._last

    def __call__(self) -> bool | None:
        return self._last
