"""Launch, watch, stop and re-attach to a trainer: the ``TrainerControl`` protocol and ``LocalProcessControl``.

The trainer runs under ``guardian.actions.runner`` in a new session and process group, output to a file, so the
guardian's Ctrl-C or death never reaches it and a later guardian reads its exit status from the exit file.
``stop``: SIGINT, SIGTERM, SIGKILL to the group (then strays), each wait until none is live; repeatable; never
pid/pgid <= 1 or our own group, never a pid that is not our wrapper. Not covered: GPU memory release, Ray on other
nodes or a pre-existing cluster, D-state processes. Why: docs/decisions/0001-trainer-wrapper-and-process-group.md.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from guardian.actions import strays
from guardian.actions.liveness import pid_alive, stat_fields
from guardian.actions.runner import pid_file_for
from guardian.logs import event, get_logger

log = get_logger("process")

RUNNER_MODULE = "guardian.actions.runner"
POLL_INTERVAL_S = 0.05
CMDLINE_ATTEMPTS = 20
CMDLINE_RETRY_S = 0.01
STRAY_ROUNDS = 3  # scans for processes outside the group (a stray may fork while it is stopped)
TREE_SCAN_S = 5.0  # a running trainer's descendants are recorded this often while its tree grows (strays.track)
TREE_SCAN_MAX_S = 30.0  # ... the wait doubles up to this while a look finds no new descendant
# ... but in its first seconds after these intervals: helpers are spawned at start, and a child is only found while
# its parent lives (a short trainer's children are re-parented to init when it ends)
TREE_SCAN_FIRST_S = (0.2, 0.3, 0.5, 1.0, 1.0, 2.0)


def next_tree_scan_s(looks: int, previous_s: float, grew: bool) -> float:
    """The wait before the next look at a trainer's process tree, after ``looks`` looks: ``TREE_SCAN_FIRST_S`` at
    first, then ``TREE_SCAN_S`` while looks find new descendants, doubling to ``TREE_SCAN_MAX_S`` while they do not
    (a stable tree - verl's Ray workers once started - costs a /proc reading every half minute, not every 5 s)."""
    if looks <= len(TREE_SCAN_FIRST_S):
        return TREE_SCAN_FIRST_S[looks - 1]
    return TREE_SCAN_S if grew else min(max(previous_s, TREE_SCAN_S) * 2, TREE_SCAN_MAX_S)


@dataclass(frozen=True)
class TrainerHandle:
    """A launched (or re-attached) trainer. ``pid`` is the wrapper's pid, which is also the process group id."""

    pid: int
    pgid: int
    exit_file: Path
    stdout_path: Path
    started_at: float
    command: tuple[str, ...]


@dataclass(frozen=True)
class ExitStatus:
    """How the trainer ended: an exit code, a signal, or neither (lost: nobody recorded it)."""

    exit_code: int | None
    signal: int | None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def lost(self) -> bool:
        return self.exit_code is None and self.signal is None

    @classmethod
    def from_returncode(cls, returncode: int) -> ExitStatus:
        """From a ``Popen.returncode``: negative means killed by that signal."""
        return cls(None, -returncode) if returncode < 0 else cls(returncode, None)

    def describe(self) -> str:
        if self.signal is not None:
            return f"killed by {signal_name(self.signal)}"
        if self.exit_code is not None:
            return f"exit code {self.exit_code}"
        return "lost (exit status not recorded)"


LOST = ExitStatus(None, None)


@dataclass(frozen=True)
class StopPolicy:
    """How long to wait after each signal of the SIGINT → SIGTERM → SIGKILL escalation (no defaults here: the
    guardian's come from ``guardian.yaml`` ``intervention.stop_*_s``)."""

    sigint_wait_s: float
    sigterm_wait_s: float
    sigkill_wait_s: float

    def __post_init__(self) -> None:
        for name in ("sigint_wait_s", "sigterm_wait_s", "sigkill_wait_s"):
            value = getattr(self, name)
            if not value >= 0:  # also rejects NaN
                raise ValueError(f"StopPolicy.{name} must be a number of seconds >= 0, got {value!r}")


@dataclass(frozen=True)
class StopResult:
    """What ``stop`` did: the signals sent (names, in order), the exit status if known, whether the process group
    is confirmed gone, and how long it took."""

    signals_sent: tuple[str, ...]
    exit: ExitStatus | None
    gone: bool
    seconds: float
    strays: tuple[int, ...] = ()  # trainer processes found outside the group after it was gone (stopped too)
    survivors: tuple[int, ...] = ()  # of those, the ones still alive after SIGKILL (then ``gone`` is False)


@dataclass(frozen=True)
class RunnerStart:
    """The wrapper's ``<exit_file>.pid`` record: the trainer's pid, the wrapper's pid (= pgid) and start time."""

    pid: int
    runner_pid: int | None
    started_at: float


class TrainerControl(Protocol):
    """Starts and stops trainers; implementations: local processes (here), Ray Jobs (later)."""

    def launch(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path,
        stdout_path: Path,
        exit_file: Path,
    ) -> TrainerHandle: ...

    def exit_status(self, handle: TrainerHandle) -> ExitStatus | None:
        """How the trainer ended; None while it still runs."""
        ...

    def is_running(self, handle: TrainerHandle) -> bool: ...

    def stop(self, handle: TrainerHandle, policy: StopPolicy) -> StopResult: ...

    def attach(
        self,
        pid: int,
        *,
        exit_file: Path,
        stdout_path: Path,
        command: Sequence[str],
        started_at: float,
    ) -> TrainerHandle | None:
        """Re-attach after a guardian restart; None if that process group no longer exists."""
        ...


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def read_exit_file(path: Path) -> ExitStatus | None:
    """The exit status the wrapper recorded, or None if it has not written one (yet). An unreadable or malformed
    file (it is written atomically, so this means outside interference) is logged and reported as lost."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning(event("exit_file_unreadable", {"path": path, "detail": str(exc)}))
        return LOST
    try:
        data = json.loads(text)
        exit_code, signum = data.get("exit_code"), data.get("signal")
        if not (exit_code is None or type(exit_code) is int) or not (signum is None or type(signum) is int):
            raise ValueError("exit_code and signal must be integers or null")
    except (ValueError, AttributeError) as exc:
        log.warning(event("exit_file_malformed", {"path": path, "detail": str(exc)}))
        return LOST
    return ExitStatus(exit_code, signum)


def read_runner_start(exit_file: Path) -> RunnerStart | None:
    """The wrapper's start record (``<exit_file>.pid``), e.g. to re-attach after the guardian died mid-launch."""
    try:
        data = json.loads(pid_file_for(exit_file).read_text(encoding="utf-8"))
        runner_pid = data.get("runner_pid")
        return RunnerStart(
            int(data["pid"]), int(runner_pid) if runner_pid is not None else None, float(data["started_at"])
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning(event("pid_file_malformed", {"path": pid_file_for(exit_file), "detail": str(exc)}))
        return None


def _check_signallable(pgid: int) -> None:
    """Never signal init, 'every process' (0/-1) or our own group: a wrong handle must fail loudly, not kill us."""
    if pgid <= 1:
        raise ValueError(f"refusing to signal process group {pgid}: a trainer's group id is always > 1")
    if pgid == os.getpgrp():
        raise ValueError(f"refusing to signal process group {pgid}: it is the guardian's own process group")


def _proc_state(pid: int) -> str | None:
    """The state letter (R, S, D, Z, ...) of ``pid`` per /proc, or None where it cannot be read."""
    fields = stat_fields(pid)
    return fields[0] if fields else None


def _proc_group_states(pgid: int) -> list[str] | None:
    """States of the processes in group ``pgid`` per /proc; None where /proc is unavailable."""
    if not os.path.exists("/proc/self/stat"):
        return None
    states: list[str] = []
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            fields = stat_fields(entry.name)
            if fields is not None and len(fields) >= 3 and fields[2] == str(pgid):
                states.append(fields[0])
    return states


def _live(state: str | None) -> bool:
    return state not in ("Z", "X")


def _group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process of the group remains. Zombies count as members for ``killpg``, and
    an orphaned wrapper's zombie may never be reaped where PID 1 is not a real init (containers), hence /proc."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists; it belongs to someone else
    leader = _proc_state(pgid)
    if leader is not None and _live(leader):
        return True  # the wrapper itself is alive: no need to scan /proc
    states = _proc_group_states(pgid)
    if not states:  # no /proc, or a /proc of another pid namespace: trust killpg
        return True
    return any(_live(state) for state in states)


def _cmdline(pid: int) -> list[str] | None:
    """The argv of ``pid`` per /proc; None where it cannot be read, [] while empty (a zombie, or mid-exec)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.rstrip(b"\0").split(b"\0")] if raw else []


def _is_our_runner(argv: Sequence[str], exit_file: Path) -> bool:
    """Whether ``argv`` is ``... -m guardian.actions.runner --exit-file <exit_file> -- ...``."""
    if RUNNER_MODULE not in argv or "--exit-file" not in argv:
        return False
    index = list(argv).index("--exit-file")
    if index + 1 >= len(argv):
        return False
    return os.path.realpath(argv[index + 1]) == os.path.realpath(exit_file)


class LocalProcessControl:
    """:class:`TrainerControl` for trainers that run as local processes (see the module docstring).

    ``clock`` and ``sleep`` drive the waits of ``stop`` (inject fakes in tests); ``python`` runs the wrapper.
    One instance is meant to be used from one thread. Discarding an instance while a trainer it launched still
    runs is allowed (the trainer goes on; re-attach with a new instance) but Python emits a ResourceWarning for
    the unreaped child.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        poll_interval_s: float = POLL_INTERVAL_S,
        python: str = sys.executable,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._poll_interval_s = poll_interval_s
        self._python = python
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        # wrapper pid -> (last look at its tree, looks, wait before the next)
        self._tree_scanned: dict[int, tuple[float, int, float]] = {}

    def launch(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path,
        stdout_path: Path,
        exit_file: Path,
    ) -> TrainerHandle:
        """Start ``command`` under the wrapper in a new session. ``env`` is the trainer's whole environment (merge
        ``os.environ`` in yourself); ``exit_file`` and its ``.pid`` sibling must not exist yet (one attempt, one
        trainer: an existing record means an earlier launch with these paths, to be attached to, not repeated)."""
        command = tuple(command)
        if not command:
            raise ValueError("cannot launch an empty command")
        exit_file = Path(os.path.abspath(exit_file))
        stdout_path = Path(os.path.abspath(stdout_path))
        for record in (exit_file, pid_file_for(exit_file)):
            if record.exists():
                raise FileExistsError(
                    f"{record} already exists: a trainer was already launched with this exit file; "
                    "attach to it or use a fresh attempt folder"
                )
        if not Path(cwd).is_dir():
            raise NotADirectoryError(f"working directory {cwd} does not exist")
        exit_file.parent.mkdir(parents=True, exist_ok=True)
        stdout_path.parent.mkdir(parents=True, exist_ok=True)
        argv = [self._python, "-m", RUNNER_MODULE, "--exit-file", str(exit_file), "--", *command]
        started_at = time.time()
        with open(stdout_path, "ab") as out:
            child = subprocess.Popen(
                argv,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**env, **strays.marker_env(str(exit_file))},  # finds what leaves the group (strays.py)
                cwd=cwd,
            )
        self._children[child.pid] = child
        handle = TrainerHandle(child.pid, child.pid, exit_file, stdout_path, started_at, command)
        log.info(event("trainer_launch", {"pid": child.pid, "pgid": child.pid, "stdout": stdout_path, "cwd": cwd}))
        return handle

    def attach(
        self,
        pid: int,
        *,
        exit_file: Path,
        stdout_path: Path,
        command: Sequence[str],
        started_at: float,
    ) -> TrainerHandle | None:
        """A handle on the wrapper ``pid`` launched earlier (possibly by another guardian process), or None when
        its process group has no live member left or ``pid`` now belongs to an unrelated process."""
        _check_signallable(pid)
        exit_file = Path(os.path.abspath(exit_file))
        handle = TrainerHandle(pid, pid, exit_file, Path(os.path.abspath(stdout_path)), started_at, tuple(command))
        self._reap(handle)
        if not _group_alive(pid):
            log.info(event("trainer_attach", {"pid": pid, "result": "gone"}))
            return None
        if pid not in self._children:
            stranger = self._foreign_leader(pid, exit_file)
            if stranger is not None:
                # The leader is alive but is not our wrapper: the pid was reused after the trainer ended.
                fields = {"pid": pid, "result": "pid_reused", "cmdline": " ".join(stranger)}
                log.warning(event("trainer_attach", fields))
                return None
        log.info(event("trainer_attach", {"pid": pid, "result": "attached"}))
        return handle

    def exit_status(self, handle: TrainerHandle) -> ExitStatus | None:
        """The trainer's exit status: the wrapper's exit file (authoritative), else the wrapper's return code if it
        is our child, else lost once the wrapper is gone; None while the wrapper (hence the trainer) still runs.
        A status means the trainer's main process ended; descendants may linger in its group (``is_running``),
        so call ``stop`` before launching the next attempt."""
        self._track(handle)
        returncode = self._reap(handle)
        recorded = read_exit_file(handle.exit_file)
        if recorded is not None:
            self._await_wrapper(handle)
            return recorded
        if returncode is not None:
            return ExitStatus.from_returncode(returncode)
        if handle.pid in self._children or self._wrapper_alive(handle):
            return None
        return read_exit_file(handle.exit_file) or LOST  # it may have landed since the first read

    def is_running(self, handle: TrainerHandle) -> bool:
        """Whether any live process of the trainer's process group remains (the wrapper, the trainer, or any
        descendant still in the group): False is what "never two trainers at once" needs."""
        self._track(handle)
        self._reap(handle)
        return _group_alive(handle.pgid)

    def stop(self, handle: TrainerHandle, policy: StopPolicy) -> StopResult:
        """SIGINT → SIGTERM → SIGKILL to the process group until no live member is left (see the module
        docstring). Returns at once with ``gone=True`` and no signal sent when the group is already gone."""
        _check_signallable(handle.pgid)
        start = self._clock()
        self._track(handle, force=True)  # what it spawned since the last tick, before the group goes
        if not self.is_running(handle):
            log.info(event("trainer_stop", {"pgid": handle.pgid, "result": "already_gone"}))
            found, stuck = self._stop_strays(handle, policy)
            return StopResult((), self.exit_status(handle), not stuck, self._clock() - start, found, tuple(stuck))
        steps = (
            (signal.SIGINT, policy.sigint_wait_s),
            (signal.SIGTERM, policy.sigterm_wait_s),
            (signal.SIGKILL, policy.sigkill_wait_s),
        )
        sent: list[str] = []
        gone = False
        for signum, wait_s in steps:
            try:
                os.killpg(handle.pgid, signum)
            except ProcessLookupError:
                gone = True
                break
            except PermissionError as exc:
                raise PermissionError(
                    f"not allowed to send {signum.name} to process group {handle.pgid} (another user's processes?)"
                ) from exc
            sent.append(signum.name)
            elapsed = round(self._clock() - start, 3)
            step = f"{len(sent)}/{len(steps)}"
            fields = {"pgid": handle.pgid, "signal": signum.name, "step": step, "wait_s": wait_s, "elapsed_s": elapsed}
            log.info(event("trainer_signal", fields))
            if self._wait_gone(handle, wait_s):
                gone = True
                break
        left: tuple[int, ...] = ()
        survivors: list[int] = []
        if gone:
            left, survivors = self._stop_strays(handle, policy)
            gone = not survivors
        seconds = self._clock() - start
        result = StopResult(tuple(sent), self.exit_status(handle), gone, seconds, left, tuple(survivors))
        fields = {"pgid": handle.pgid, "signals": ",".join(sent), "seconds": round(seconds, 3)}
        if gone:
            exit_text = result.exit.describe() if result.exit is not None else "unknown"
            log.info(event("trainer_stop", {**fields, "result": "gone", "exit": exit_text}))
        else:
            log.error(
                event(
                    "trainer_stop",
                    {
                        **fields,
                        "result": "still_alive",
                        "survivors": ",".join(map(str, survivors)) or f"group {handle.pgid}",
                        "hint": "processes survived SIGKILL (D state?)",
                    },
                )
            )
        return result

    def _stop_strays(self, handle: TrainerHandle, policy: StopPolicy) -> tuple[tuple[int, ...], list[int]]:
        """Stop the trainer's processes that left its group, scanning again for any they forked meanwhile
        (a few rounds); returns (all found, those still alive after SIGKILL)."""
        found: list[int] = []
        survivors: list[int] = []
        for _ in range(STRAY_ROUNDS):
            new = [pid for pid in strays.find(str(handle.exit_file)) if pid not in found]
            if not new:
                break
            found.extend(new)
            commands = "; ".join(f"{pid}: {strays.command_of(pid)}" for pid in new)
            fields = {"pgid": handle.pgid, "pids": ",".join(map(str, new)), "commands": commands}
            log.warning(event("trainer_strays", fields))
            survivors += strays.terminate(
                new,
                term_wait_s=policy.sigterm_wait_s,
                kill_wait_s=policy.sigkill_wait_s,
                alive=pid_alive,
                clock=self._clock,
                sleep=self._sleep,
            )
        return tuple(found), survivors

    def _track(self, handle: TrainerHandle, *, force: bool = False) -> None:
        """Record the trainer's descendants by pid tree (``strays.track``) while its wrapper runs: a child that
        leaves both the group and the environment is still found by ``stop`` and the end-of-run sweep. At most
        ``next_tree_scan_s`` apart unless ``force``, from a reading of /proc another run's tick made within
        ``strays.TABLE_REUSE_S`` (but for the first look and a forced one); our own wrapper once reaped (its pid may
        be reused) never."""
        child = self._children.get(handle.pid)
        if child is not None and child.returncode is not None:
            return
        now = time.monotonic()
        last, looks, wait_s = self._tree_scanned.get(handle.pid, (None, 0, 0.0))
        if not force and last is not None and now - last < wait_s:
            return
        grew = strays.track(str(handle.exit_file), handle.pid, fresh=force or last is None)  # a first look: /proc now
        self._tree_scanned[handle.pid] = (now, looks + 1, next_tree_scan_s(looks + 1, wait_s, grew > 0))

    def _wait_gone(self, handle: TrainerHandle, wait_s: float) -> bool:
        """Poll until the group has no live member (True) or ``wait_s`` has passed (False); reaps our child."""
        deadline = self._clock() + wait_s
        while True:
            if not self.is_running(handle):
                return True
            remaining = deadline - self._clock()
            if remaining <= 0:
                return False
            self._sleep(min(self._poll_interval_s, remaining))

    def _foreign_leader(self, pid: int, exit_file: Path) -> list[str] | None:
        """The argv of process ``pid`` if it is alive and is not our wrapper for ``exit_file``; None when it is ours
        or cannot be told (no /proc, gone, a zombie). A process's cmdline reads empty for a moment during exec,
        so an empty one is read again a few times."""
        for _ in range(CMDLINE_ATTEMPTS):
            state = _proc_state(pid)
            if state is None or not _live(state):
                return None
            argv = _cmdline(pid)
            if argv is None:
                return None
            if argv:
                return None if _is_our_runner(argv, exit_file) else argv
            self._sleep(CMDLINE_RETRY_S)
        return None

    def _await_wrapper(self, handle: TrainerHandle, timeout_s: float = 5.0) -> None:
        """The wrapper exits right after writing the exit file: reap our child so no zombie (or unwaited
        ``Popen``) outlives the trainer."""
        child = self._children.get(handle.pid)
        if child is not None and child.returncode is None:
            try:
                child.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.warning(event("wrapper_lingers", {"pid": handle.pid, "after_s": timeout_s}))

    def _reap(self, handle: TrainerHandle) -> int | None:
        """Collect our child wrapper's status if it ended (no zombie left behind); None if running or not ours."""
        child = self._children.get(handle.pid)
        return child.poll() if child is not None else None

    def _wrapper_alive(self, handle: TrainerHandle) -> bool:
        """For a wrapper that is not our child: alive, not a zombie, and still the leader of the trainer's group."""
        try:
            if os.getpgid(handle.pid) != handle.pgid:
                return False
        except ProcessLookupError:
            return False
        state = _proc_state(handle.pid)
        return state is None or _live(state)  # None: no /proc, and getpgid said it exists
