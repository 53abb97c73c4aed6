"""Trainer processes that left the trainer's process group, found by an environment marker and by the pid tree.

Each trainer gets ``GUARDIAN_TRAINER=<exit file>`` (and ``SPT_NOENV=1``); live descendants are tracked by pid and
start time while it runs, so a reused pid is never taken for one. Linux ``/proc`` only.
Missed: a pre-existing Ray cluster's workers, and a double fork that also rewrote its environment between two ticks.
Why: docs/decisions/0002-strays-by-marker-and-pid-tree.md.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from guardian.actions.liveness import stat_fields
from guardian.logs import event, get_logger

log = get_logger("strays")

MARKER: Final = "GUARDIAN_TRAINER"
PROC: Final = Path("/proc")
SCAN_TIMEOUT_S: Final = 10.0  # reading a process stuck in the kernel (D state) can block


# marker value -> {pid: start time} of the trainer's descendants seen so far (``track``), for every trainer this
# process follows (a fleet's runs, each in its thread)
_TREE: dict[str, dict[int, int]] = {}
_ROOTS: dict[str, tuple[int, int]] = {}  # marker value -> (the wrapper's pid, its start time) when first seen
_TREE_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class _Stat:
    state: str
    ppid: int
    start: int | None  # clock ticks since boot; None where the line is short (not a real /proc)


def _read_stat(entry: Path) -> _Stat | None:
    return _parse_stat(stat_fields(entry.name, entry.parent))


def _parse_stat(fields: list[str] | None) -> _Stat | None:  # state ppid pgrp ... starttime (20th)
    if fields is None or len(fields) < 2 or not fields[1].lstrip("-").isdigit():
        return None
    start = int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None
    return _Stat(fields[0], int(fields[1]), start)


def _table(proc: Path) -> dict[int, _Stat]:
    table: dict[int, _Stat] = {}
    root = str(proc)
    try:
        names = [name for name in os.listdir(root) if name.isdigit()]
    except OSError:
        return table
    for name in names:  # a Ray node has hundreds: names as strings, one open and one read each
        stat = _parse_stat(stat_fields(name, root))
        if stat is not None:
            table[int(name)] = stat
    return table


def _descendants(table: Mapping[int, _Stat], roots: Iterable[int]) -> dict[int, _Stat]:
    children: dict[int, list[int]] = defaultdict(list)
    for pid, stat in table.items():
        children[stat.ppid].append(pid)
    found: dict[int, _Stat] = {}
    stack = list(roots)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found[child] = table[child]
                stack.append(child)
    return found


def _live(stat: _Stat | None) -> bool:
    return stat is not None and stat.state not in ("Z", "X")


TABLE_REUSE_S: Final = 1.0  # a fleet's runs record their trees from one reading of /proc within this long
_last_table: tuple[float, Path, dict[int, _Stat]] | None = None


def _shared_table(proc: Path) -> dict[int, _Stat]:
    """``_table(proc)``, read again only when the last reading (by any thread) is older than ``TABLE_REUSE_S``."""
    global _last_table
    with _TREE_LOCK:
        last = _last_table
    now = time.monotonic()
    if last is not None and last[1] == proc and now - last[0] < TABLE_REUSE_S:
        return last[2]
    table = _table(proc)
    with _TREE_LOCK:
        _last_table = (now, proc, table)
    return table


def track(value: str, root: int, proc: Path = PROC, *, fresh: bool = False) -> int:
    """Record the live descendants of ``root`` (the trainer's wrapper, the leader of its group) under the marker
    ``value``: what ``find`` also returns later, whatever became of their group and environment. ``root`` counts
    as the one first seen under ``value`` only while its start time stays the same (a reused pid adopts nothing).
    ``fresh``: read /proc now (a stop's last look), not a reading another run's tick made a moment ago. Returns
    how many descendants were recorded for the first time."""
    table = _table(proc) if fresh else _shared_table(proc)
    root_stat = table.get(root)
    with _TREE_LOCK:
        known = _TREE.setdefault(value, {})
        for pid, start in list(known.items()):  # forget the dead: the table stays the size of the live tree
            if table.get(pid) is None or table[pid].start != start or not _live(table[pid]):
                del known[pid]
        if not _live(root_stat) or root_stat is None or root_stat.start is None:
            return 0
        first = _ROOTS.setdefault(value, (root, root_stat.start))
        if first != (root, root_stat.start):
            return 0
        new = 0
        for pid, stat in _descendants(table, [root]).items():
            if stat.start is not None and _live(stat) and pid != os.getpid():
                new += known.get(pid) != stat.start
                known[pid] = stat.start
        return new


def _tracked(value: str, under: bool) -> dict[int, int]:
    prefix = value.rstrip("/") + "/"
    with _TREE_LOCK:
        return {
            pid: start
            for key, pids in _TREE.items()
            if (key.startswith(prefix) if under else key == value)
            for pid, start in pids.items()
        }


def marker_env(value: str) -> dict[str, str]:
    """What a trainer's environment gets so that its strays can be found."""
    return {MARKER: value, "SPT_NOENV": "1"}


def find(value: str, proc: Path = PROC, timeout_s: float = SCAN_TIMEOUT_S, *, under: bool = False) -> list[int]:
    """Live pids (not this process) whose start-up environment has ``GUARDIAN_TRAINER=value`` (with
    ``under``: a value inside the folder ``value``, i.e. any attempt of one run), the trainer's descendants ``track``
    recorded under it that are still the same processes, and every live descendant of those found.

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
    tracked = _tracked(value, under)

    def scan() -> None:
        table: dict[int, _Stat] = {}
        for entry in entries:
            at[:] = [entry.name]
            pid = int(entry.name)
            stat = _read_stat(entry)
            if stat is not None:
                table[pid] = stat
            if pid in tracked and _live(stat) and stat is not None and stat.start == tracked[pid]:
                found.append(pid)  # a descendant seen while the trainer ran, still the same process
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:  # gone meanwhile, a kernel thread, or not ours to read
                continue
            if any(matches(e) for e in environ.split(b"\0")) and not _is_zombie(entry):
                found.append(pid)
        # what those forked since (a stray's children inherit its environment: no marker where it had none)
        more = _descendants(table, found)
        found.extend(pid for pid, stat in more.items() if _live(stat) and pid != os.getpid() and pid not in found)

    worker = threading.Thread(target=scan, name="guardian-stray-scan", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        log.warning(event("stray_scan_timeout", {"after_s": timeout_s, "stuck_at_pid": at[0] if at else "?"}))
    return sorted(set(found))


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
    fields = stat_fields(entry.name, entry.parent)
    return fields is None or fields[:1] == ["Z"]
