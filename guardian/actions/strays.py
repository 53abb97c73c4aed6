"""Trainer processes that left the trainer's process group, found by an environment marker.

Stopping a process group misses whatever escaped it: a daemonised helper, a process that called
``setsid``, the workers of a Ray instance the trainer started. Every process the trainer spawns
inherits its environment, so ``LocalProcessControl`` gives each trainer ``GUARDIAN_TRAINER=<its exit
file>`` and, after stopping the group, looks for live processes still carrying that exact value
(``/proc/<pid>/environ``: Linux; the environment a process started with) and stops them too. Workers
of a Ray cluster that existed before the trainer do not inherit it: use ``ray stop`` or the Jobs API.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Final

MARKER: Final = "GUARDIAN_TRAINER"
PROC: Final = Path("/proc")


def find(value: str, proc: Path = PROC) -> list[int]:
    """Live pids (not this process) whose start-up environment has ``GUARDIAN_TRAINER=value``; [] where
    there is no ``/proc``. Processes we may not read (another user's) are skipped."""
    wanted = f"{MARKER}={value}".encode()
    found = []
    try:
        entries = list(proc.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, a kernel thread, or not ours to read
            continue
        if wanted in environ.split(b"\0") and not _is_zombie(entry):
            found.append(int(entry.name))
    return sorted(found)


def command_of(pid: int, proc: Path = PROC) -> str:
    """The process's command line, shortened, for a log line ("?" when unreadable)."""
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)[:120] or "?"


def terminate(
    pids: list[int],
    *,
    wait_s: float,
    alive: Callable[[int], bool],
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    poll_s: float = 0.05,
) -> list[int]:
    """SIGTERM, wait up to ``wait_s``, then SIGKILL and wait again; returns the pids still alive after that."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):  # gone, or not ours to stop
                os.kill(pid, signum)
        deadline = clock() + wait_s
        while True:
            pids = [pid for pid in pids if alive(pid)]
            if not pids or clock() >= deadline:
                break
            sleep(poll_s)
        if not pids:
            return []
    return pids


def _is_zombie(entry: Path) -> bool:
    try:
        stat = (entry / "stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]
