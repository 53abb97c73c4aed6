"""Trainer processes that left the trainer's process group, found by an environment marker.

Stopping a process group misses whatever escaped it: a daemonised helper, a process that called
``setsid``, the workers of a Ray instance the trainer started. Every process the trainer spawns
inherits its environment, so ``LocalProcessControl`` gives each trainer ``GUARDIAN_TRAINER=<its exit
file>`` (and ``SPT_NOENV=1``, so that ``setproctitle``, which Ray and vLLM use, leaves the environment
block alone) and, after stopping the group, looks for live processes still carrying that exact value
(``/proc/<pid>/environ``: Linux; the environment a process started with) and stops them too.

Missed: workers of a Ray cluster that existed before the trainer (they do not inherit it: use
``ray stop`` or the Jobs API) and a process that rewrites its own environment block.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

from guardian.logs import event, get_logger

log = get_logger("strays")

MARKER: Final = "GUARDIAN_TRAINER"
PROC: Final = Path("/proc")
SCAN_TIMEOUT_S: Final = 10.0  # reading a process stuck in the kernel (D state) can block


def marker_env(value: str) -> dict[str, str]:
    """What a trainer's environment gets so that its strays can be found."""
    return {MARKER: value, "SPT_NOENV": "1"}


def find(value: str, proc: Path = PROC, timeout_s: float = SCAN_TIMEOUT_S, *, under: bool = False) -> list[int]:
    """Live pids (not this process) whose start-up environment has ``GUARDIAN_TRAINER=value`` (with
    ``under``: a value inside the folder ``value``, i.e. any attempt of one run).

    Processes we may not read (another user's) are skipped. Where there is no readable ``/proc`` the
    answer is [] with a warning. The scan runs in a helper thread: if it takes longer than
    ``timeout_s`` (a process in D state), what it found so far is returned, with a warning.
    """
    wanted = f"{MARKER}={value}".encode()
    prefix = f"{MARKER}={value.rstrip('/')}/".encode()

    def matches(entry: bytes) -> bool:
        return entry.startswith(prefix) if under else entry == wanted

    found: list[int] = []
    at: list[str] = []
    try:
        entries = [e for e in proc.iterdir() if e.name.isdigit() and int(e.name) != os.getpid()]
    except OSError as exc:
        log.warning(event("stray_scan_unavailable", {"proc": proc, "detail": exc.strerror}))
        return []

    def scan() -> None:
        for entry in entries:
            at[:] = [entry.name]
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:  # gone meanwhile, a kernel thread, or not ours to read
                continue
            if any(matches(e) for e in environ.split(b"\0")) and not _is_zombie(entry):
                found.append(int(entry.name))

    worker = threading.Thread(target=scan, name="guardian-stray-scan", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        log.warning(event("stray_scan_timeout", {"after_s": timeout_s, "stuck_at_pid": at[0] if at else "?"}))
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
    term_wait_s: float,
    kill_wait_s: float,
    alive: Callable[[int], bool],
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    poll_s: float = 0.05,
) -> list[int]:
    """SIGTERM, wait up to ``term_wait_s``, then SIGKILL and wait up to ``kill_wait_s``; returns the pids
    still alive after that."""
    for signum, wait_s in ((signal.SIGTERM, term_wait_s), (signal.SIGKILL, kill_wait_s)):
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
