"""LocalProcessControl and the runner wrapper, with real processes: launch, exit status, the stop escalation,
grandchildren, re-attach after a guardian restart or SIGKILL, and the safety refusals."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from guardian.actions import strays
from guardian.actions.process import (
    TREE_SCAN_FIRST_S,
    TREE_SCAN_MAX_S,
    TREE_SCAN_S,
    ExitStatus,
    LocalProcessControl,
    StopPolicy,
    TrainerControl,
    TrainerHandle,
    next_tree_scan_s,
    read_exit_file,
    read_runner_start,
)

# A wait ends as soon as the group is gone, so these bounds cost nothing when the first signal works; they only
# absorb a loaded machine, where a Python trainer may need a while to run its KeyboardInterrupt and exit.
FAST = StopPolicy(sigint_wait_s=5.0, sigterm_wait_s=2.0, sigkill_wait_s=2.0)

TRAINER = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time

    mode, ready = sys.argv[1], sys.argv[2]
    if mode == "ok":
        print("hello from the trainer", flush=True)
        print("and stderr too", file=sys.stderr, flush=True)
        sys.exit(0)
    if mode == "fail7":
        sys.exit(7)
    if mode in ("no_sigint", "no_sigint_no_sigterm"):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if mode == "no_sigint_no_sigterm":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode in ("grandchild", "escapee", "escapee_then_exit"):
        # escapee: a helper that leaves the process group (setsid), as a daemon or a Ray instance may
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=mode != "grandchild"
        )
        with open(ready + ".grandchild", "w") as f:
            f.write(str(child.pid))
    if mode == "escapee_then_exit":
        open(ready, "w").close()
        sys.exit(0)
    if mode == "noenv_short":  # a helper started at once, then a trainer that ends by itself a moment later
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True, env={})
        with open(ready + ".grandchild", "w") as f:
            f.write(str(child.pid))
        time.sleep(1.5)
        sys.exit(0)
    if mode in ("noenv_escapee", "noenv_escapee_then_exit"):
        # leaves the group and the environment: no GUARDIAN_TRAINER marker to find it by
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True, env={})
        with open(ready + ".grandchild", "w") as f:
            f.write(str(child.pid))
    if mode == "noenv_escapee_then_exit":
        open(ready, "w").close()
        while not os.path.exists(ready + ".go"):
            time.sleep(0.02)
        sys.exit(0)
    with open(ready + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(ready + ".tmp", ready)
    if mode == "until_go":
        while not os.path.exists(ready + ".go"):
            time.sleep(0.02)
        sys.exit(3)
    time.sleep(60)
    """
)

GUARDIAN = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    from guardian.actions.process import LocalProcessControl

    trainer, ready, attempt = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    handle = LocalProcessControl().launch(
        [sys.executable, trainer, "sleep", ready], env=dict(os.environ), cwd=attempt,
        stdout_path=attempt / "stdout.log", exit_file=attempt / "exit.json",
    )
    print(json.dumps({"pid": handle.pid, "started_at": handle.started_at}), flush=True)
    time.sleep(60)
    """
)


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie may linger where PID 1 does not reap)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X")


class Attempt:
    """An attempt folder with the trainer script; launches it under a control."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.script = root / "trainer.py"
        self.script.write_text(TRAINER)
        self.ready = root / "ready"
        self.stdout = root / "out" / "stdout.log"
        self.exit_file = root / "out" / "exit.json"

    def diagnose(self, what: object) -> str:
        """For a failure message: what happened, the trainer's output and its exit record."""
        record = self.exit_file.read_text() if self.exit_file.exists() else "(no exit file)"
        return f"{what}\n--- trainer output ---\n{self.stdout.read_text()}--- exit file ---\n{record}"

    def command(self, mode: str) -> list[str]:
        return [sys.executable, str(self.script), mode, str(self.ready)]

    def launch(self, control: TrainerControl, mode: str, wait_ready: bool = True) -> TrainerHandle:
        handle = control.launch(
            self.command(mode), env=dict(os.environ), cwd=self.root, stdout_path=self.stdout, exit_file=self.exit_file
        )
        if wait_ready:
            wait_for(self.ready.exists, what="the trainer to be ready")
        return handle


@pytest.fixture
def attempt(tmp_path: Path) -> Attempt:
    return Attempt(tmp_path)


class TrackingControl(LocalProcessControl):
    """Remembers what it launched, so the fixture can stop it: a failing test leaves no process behind."""

    def __init__(self) -> None:
        super().__init__()
        self.launched: list[TrainerHandle] = []

    def launch(
        self, command: Sequence[str], *, env: Mapping[str, str], cwd: Path, stdout_path: Path, exit_file: Path
    ) -> TrainerHandle:
        handle = super().launch(command, env=env, cwd=cwd, stdout_path=stdout_path, exit_file=exit_file)
        self.launched.append(handle)
        return handle


@pytest.fixture
def control() -> Iterator[LocalProcessControl]:
    ctl = TrackingControl()
    yield ctl
    for handle in ctl.launched:
        ctl.stop(handle, StopPolicy(0.5, 0.5, 2.0))


def final_status(control: LocalProcessControl, handle: TrainerHandle) -> ExitStatus:
    statuses: list[ExitStatus] = []

    def ended() -> bool:
        status = control.exit_status(handle)
        if status is not None:
            statuses.append(status)
        return status is not None

    wait_for(ended, what="the trainer to exit")
    return statuses[-1]


def test_clean_exit_is_recorded_and_output_goes_to_the_file(control: LocalProcessControl, attempt: Attempt) -> None:
    handle = attempt.launch(control, "ok", wait_ready=False)
    assert handle.pid == handle.pgid and handle.exit_file.is_absolute()
    status = final_status(control, handle)
    assert status == ExitStatus(0, None) and status.ok and status.describe() == "exit code 0"
    record = json.loads(attempt.exit_file.read_text())
    assert record["exit_code"] == 0 and record["signal"] is None and record["ended_at"] > handle.started_at - 1
    start = read_runner_start(attempt.exit_file)
    assert start is not None and start.pid == record["pid"] and start.runner_pid == handle.pid
    text = attempt.stdout.read_text()
    assert "hello from the trainer" in text and "and stderr too" in text
    wait_for(lambda: not control.is_running(handle), what="the group to be gone")


def test_nonzero_exit_code(control: LocalProcessControl, attempt: Attempt) -> None:
    handle = attempt.launch(control, "fail7", wait_ready=False)
    status = final_status(control, handle)
    assert status == ExitStatus(7, None) and not status.ok and status.describe() == "exit code 7"


def test_sigint_stops_a_plain_trainer_and_a_second_stop_is_a_no_op(
    control: LocalProcessControl, attempt: Attempt
) -> None:
    handle = attempt.launch(control, "sleep")
    assert control.is_running(handle) and control.exit_status(handle) is None
    result = control.stop(handle, FAST)
    assert result.gone and result.signals_sent == ("SIGINT",), attempt.diagnose(result)
    assert result.exit == ExitStatus(None, signal.SIGINT) and result.exit.describe() == "killed by SIGINT"
    again = control.stop(handle, FAST)
    assert again.gone and again.signals_sent == () and again.exit == result.exit and again.seconds < 1.0
    assert not control.is_running(handle)


def test_trainer_ignoring_sigint_gets_sigterm(control: LocalProcessControl, attempt: Attempt) -> None:
    handle = attempt.launch(control, "no_sigint")
    result = control.stop(handle, StopPolicy(sigint_wait_s=0.3, sigterm_wait_s=2.0, sigkill_wait_s=2.0))
    assert result.gone and result.signals_sent == ("SIGINT", "SIGTERM")
    assert result.exit == ExitStatus(None, signal.SIGTERM)


def test_trainer_ignoring_sigint_and_sigterm_needs_sigkill(control: LocalProcessControl, attempt: Attempt) -> None:
    handle = attempt.launch(control, "no_sigint_no_sigterm")
    result = control.stop(handle, StopPolicy(sigint_wait_s=0.3, sigterm_wait_s=0.3, sigkill_wait_s=2.0))
    assert result.gone and result.signals_sent == ("SIGINT", "SIGTERM", "SIGKILL")
    # SIGKILL takes the wrapper too, so no exit file: the status is the wrapper's own, known as it is our child.
    assert read_exit_file(attempt.exit_file) is None
    assert result.exit == ExitStatus(None, signal.SIGKILL) and result.exit.describe() == "killed by SIGKILL"
    assert 0.6 <= result.seconds < 3.0


def test_grandchild_in_the_group_is_gone_after_stop(control: LocalProcessControl, attempt: Attempt) -> None:
    handle = attempt.launch(control, "grandchild")
    grandchild = int(Path(str(attempt.ready) + ".grandchild").read_text())
    assert pid_alive(grandchild) and os.getpgid(grandchild) == handle.pgid
    result = control.stop(handle, FAST)
    assert result.gone
    assert not pid_alive(grandchild)


def test_status_survives_a_discarded_control_and_a_new_one_reattaches(attempt: Attempt) -> None:
    first = LocalProcessControl()
    handle = attempt.launch(first, "until_go")
    with pytest.warns(ResourceWarning, match="still running"):  # the "dead guardian" never reaps its child
        del first
        gc.collect()
    second = LocalProcessControl()
    attached = second.attach(
        handle.pid,
        exit_file=attempt.exit_file,
        stdout_path=attempt.stdout,
        command=handle.command,
        started_at=handle.started_at,
    )
    assert attached == handle
    assert second.is_running(attached) and second.exit_status(attached) is None
    Path(str(attempt.ready) + ".go").touch()
    assert final_status(second, attached) == ExitStatus(3, None)
    wait_for(lambda: not second.is_running(attached), what="the group to be gone")
    reattached = second.attach(
        handle.pid, exit_file=attempt.exit_file, stdout_path=attempt.stdout, command=(), started_at=0.0
    )
    assert reattached is None
    assert read_exit_file(attempt.exit_file) == ExitStatus(3, None)
    stopped = second.stop(attached, FAST)
    assert stopped.gone and stopped.signals_sent == () and stopped.exit == ExitStatus(3, None)


def test_sigkilled_guardian_leaves_the_trainer_running(tmp_path: Path, attempt: Attempt) -> None:
    script = tmp_path / "guardian_proc.py"
    script.write_text(GUARDIAN)
    folder = tmp_path / "attempt"
    folder.mkdir()
    with subprocess.Popen(
        [sys.executable, str(script), str(attempt.script), str(attempt.ready), str(folder)], stdout=subprocess.PIPE
    ) as guardian:
        assert guardian.stdout is not None
        launched = json.loads(guardian.stdout.readline())
        wait_for(attempt.ready.exists, what="the trainer to be ready")
        guardian.kill()
        assert guardian.wait(timeout=5) == -signal.SIGKILL
    control = LocalProcessControl()
    handle = control.attach(
        launched["pid"],
        exit_file=folder / "exit.json",
        stdout_path=folder / "stdout.log",
        command=["python", "trainer.py"],
        started_at=launched["started_at"],
    )
    assert handle is not None
    try:
        time.sleep(0.2)
        assert control.is_running(handle) and control.exit_status(handle) is None
    finally:
        result = control.stop(handle, FAST)
    assert result.gone and result.signals_sent == ("SIGINT",)
    assert result.exit == ExitStatus(None, signal.SIGINT)  # recorded by the wrapper, which outlived the guardian


def test_attach_refuses_an_unrelated_process(tmp_path: Path) -> None:
    with subprocess.Popen(["sleep", "30"], start_new_session=True) as stranger:
        try:
            control = LocalProcessControl()
            handle = control.attach(
                stranger.pid, exit_file=tmp_path / "exit.json", stdout_path=tmp_path / "o", command=(), started_at=0
            )
            assert handle is None
            assert pid_alive(stranger.pid)
        finally:
            stranger.kill()


def test_stop_follows_the_injected_clock(control: LocalProcessControl, attempt: Attempt) -> None:
    now = [0.0]

    def fake_sleep(seconds: float) -> None:
        now[0] += seconds
        time.sleep(0.01)

    clocked = LocalProcessControl(clock=lambda: now[0], sleep=fake_sleep, poll_interval_s=1.0)
    handle = attempt.launch(control, "no_sigint_no_sigterm")
    # 30 s + 30 s of fake time in about a second of real time; the SIGKILL wait ends as soon as the group is gone.
    result = clocked.stop(handle, StopPolicy(sigint_wait_s=30.0, sigterm_wait_s=30.0, sigkill_wait_s=300.0))
    assert result.signals_sent == ("SIGINT", "SIGTERM", "SIGKILL") and result.gone
    assert 60.0 <= result.seconds < 90.0
    # Not its child and SIGKILLed with the rest of the group, the wrapper recorded nothing: the status is lost.
    assert result.exit == ExitStatus(None, None) and result.exit.describe().startswith("lost")


def test_refuses_to_signal_init_or_its_own_group(tmp_path: Path) -> None:
    control = LocalProcessControl()
    for pgid in (0, 1, os.getpgrp()):
        bogus = TrainerHandle(pgid, pgid, tmp_path / "exit.json", tmp_path / "out", 0.0, ("x",))
        with pytest.raises(ValueError, match="refusing to signal"):
            control.stop(bogus, FAST)


def test_launch_refuses_a_used_exit_file_and_an_empty_command(control: LocalProcessControl, attempt: Attempt) -> None:
    attempt.exit_file.parent.mkdir(parents=True)
    attempt.exit_file.write_text('{"exit_code": 0, "signal": null}')
    with pytest.raises(FileExistsError, match="already exists"):
        attempt.launch(control, "ok", wait_ready=False)
    with pytest.raises(ValueError, match="empty command"):
        control.launch([], env={}, cwd=attempt.root, stdout_path=attempt.stdout, exit_file=attempt.root / "e.json")


def test_runner_records_a_command_that_cannot_start(tmp_path: Path) -> None:
    exit_file = tmp_path / "exit.json"
    missing = str(tmp_path / "no-such-program")
    done = subprocess.run(
        [sys.executable, "-m", "guardian.actions.runner", "--exit-file", str(exit_file), "--", missing],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 127 and "cannot start" in done.stderr
    assert read_exit_file(exit_file) == ExitStatus(127, None)
    usage = subprocess.run(
        [sys.executable, "-m", "guardian.actions.runner", "--exit-file", str(exit_file)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert usage.returncode == 2 and "no command" in usage.stderr


def test_stop_policy_rejects_negative_waits() -> None:
    with pytest.raises(ValueError, match="sigterm_wait_s"):
        StopPolicy(sigint_wait_s=30.0, sigterm_wait_s=-1, sigkill_wait_s=10.0)


def test_exit_status_reading_and_describing(tmp_path: Path) -> None:
    assert ExitStatus.from_returncode(-9).describe() == "killed by SIGKILL"
    assert ExitStatus.from_returncode(1) == ExitStatus(1, None)
    assert ExitStatus(None, None).describe() == "lost (exit status not recorded)"
    assert ExitStatus(None, 200).describe() == "killed by signal 200"
    path = tmp_path / "exit.json"
    assert read_exit_file(path) is None
    path.write_text("not json")
    assert read_exit_file(path) == ExitStatus(None, None)
    path.write_text('{"exit_code": "1", "signal": null}')
    assert read_exit_file(path) == ExitStatus(None, None)


@pytest.mark.parametrize("mode", ["escapee", "escapee_then_exit"])
def test_stop_also_stops_what_left_the_group(
    control: LocalProcessControl, attempt: Attempt, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    handle = attempt.launch(control, mode)
    escapee = int(Path(str(attempt.ready) + ".grandchild").read_text())
    assert os.getpgid(escapee) != handle.pgid  # outside the group: killpg cannot reach it
    if mode == "escapee_then_exit":
        final_status(control, handle)  # the trainer is gone; its helper lives on
    with caplog.at_level("WARNING", logger="guardian"):
        result = control.stop(handle, FAST)
    assert result.gone and result.strays == (escapee,)
    wait_for(lambda: not pid_alive(escapee), what="the escapee to be gone")
    assert any("event=trainer_strays" in r.getMessage() and str(escapee) in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("mode", ["noenv_escapee", "noenv_escapee_then_exit"])
def test_a_child_that_left_the_group_and_the_environment_is_still_found_and_stopped(
    control: LocalProcessControl, attempt: Attempt, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """H9: a child started with ``start_new_session=True, env={...}`` carries neither the trainer's process group
    nor its ``GUARDIAN_TRAINER`` marker; the pid tree the control saw while the trainer ran still finds it."""
    handle = attempt.launch(control, mode)
    escapee = int(Path(str(attempt.ready) + ".grandchild").read_text())
    try:
        assert os.getpgid(escapee) != handle.pgid
        assert b"GUARDIAN_TRAINER" not in Path(f"/proc/{escapee}/environ").read_bytes()
        assert control.is_running(handle)  # a tick of the guard loop: the control looks at the trainer's tree
        if mode == "noenv_escapee_then_exit":
            Path(str(attempt.ready) + ".go").touch()
            final_status(control, handle)  # the trainer ended by itself; its helper lives on, now init's child
            assert escapee in strays.find(str(handle.exit_file)), "named as a stray after the exit (observe)"
        with caplog.at_level("WARNING", logger="guardian"):
            result = control.stop(handle, FAST)
        assert result.gone and escapee in result.strays
        wait_for(lambda: not pid_alive(escapee), what="the escapee to be gone")
        assert any("event=trainer_strays" in r.getMessage() and str(escapee) in r.getMessage() for r in caplog.records)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(escapee, signal.SIGKILL)


def test_a_short_trainers_helper_that_left_group_and_environment_is_found_by_the_ticks_alone(
    control: LocalProcessControl, attempt: Attempt
) -> None:
    """H9 as ``guardian run`` meets it: the ticks (``exit_status``) are the only looks at the tree, the helper is
    spawned right after the launch and the trainer ends 1.5 s later, re-parenting it to init."""
    handle = attempt.launch(control, "noenv_short", wait_ready=False)
    assert final_status(control, handle).ok
    escapee = int(Path(str(attempt.ready) + ".grandchild").read_text())
    try:
        assert escapee in strays.find(str(handle.exit_file))
        result = control.stop(handle, FAST)
        assert result.gone and escapee in result.strays
        wait_for(lambda: not pid_alive(escapee), what="the escapee to be gone")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(escapee, signal.SIGKILL)


def test_stray_scan_matches_the_exact_marker_of_live_processes_only(tmp_path: Path) -> None:
    proc = tmp_path / "proc"

    def process(pid: int, env: list[str], state: str = "S") -> None:
        folder = proc / str(pid)
        folder.mkdir(parents=True)
        (folder / "environ").write_bytes(b"\0".join(e.encode() for e in env) + b"\0")
        (folder / "stat").write_text(f"{pid} (python (x)) {state} 1 1")
        (folder / "cmdline").write_bytes(b"python\0-c\0work\0")

    mine = "GUARDIAN_TRAINER=/runs/a/attempt-1/exit.json"
    process(101, ["PATH=/bin", mine])
    process(102, ["GUARDIAN_TRAINER=/runs/a/attempt-1/exit.json.old"])  # a longer value: someone else
    process(103, ["X=GUARDIAN_TRAINER=/runs/a/attempt-1/exit.json"])  # the value inside another variable
    process(104, [mine], state="Z")  # a zombie holds nothing
    process(105, ["GUARDIAN_TRAINER=/runs/b/attempt-1/exit.json"])  # another trainer
    process(os.getpid(), [mine])  # the guardian itself is never a stray
    (proc / "self").mkdir()
    assert strays.find("/runs/a/attempt-1/exit.json", proc) == [101]
    assert strays.command_of(101, proc) == "python -c work" and strays.command_of(999, proc) == "?"
    assert strays.find("/runs/a/attempt-1/exit.json", tmp_path / "no-proc") == []  # no /proc: nothing, logged


def test_a_look_at_the_tree_counts_the_descendants_it_records_for_the_first_time(tmp_path: Path) -> None:
    proc = tmp_path / "proc"

    def process(pid: int, ppid: int, start: int) -> None:
        (proc / str(pid)).mkdir(parents=True, exist_ok=True)
        fields = ["S", str(ppid), *["0"] * 17, str(start)]  # state ppid ... starttime (proc(5) field 22)
        (proc / str(pid) / "stat").write_text(f"{pid} (python) {' '.join(fields)}")

    exit_file = str(tmp_path / "attempt-1" / "exit.json")
    process(200, 1, 50)  # the wrapper
    process(201, 200, 60)
    process(300, 1, 70)  # not ours
    assert strays.track(exit_file, 200, proc, fresh=True) == 1
    assert strays.track(exit_file, 200, proc, fresh=True) == 0  # the same tree: nothing new
    process(202, 201, 80)
    assert strays.track(exit_file, 200, proc, fresh=True) == 1
    process(201, 200, 90)  # pid 201 reused by another process
    assert strays.track(exit_file, 200, proc, fresh=True) == 1


def test_looks_at_a_stable_tree_back_off_and_a_growing_one_brings_them_back() -> None:
    first = [next_tree_scan_s(looks, 0.0, grew=True) for looks in range(1, len(TREE_SCAN_FIRST_S) + 1)]
    assert first == list(TREE_SCAN_FIRST_S)
    waits, wait = [], TREE_SCAN_FIRST_S[-1]
    for looks in range(len(TREE_SCAN_FIRST_S) + 1, len(TREE_SCAN_FIRST_S) + 5):
        wait = next_tree_scan_s(looks, wait, grew=False)
        waits.append(wait)
    assert waits == [2 * TREE_SCAN_S, 4 * TREE_SCAN_S, TREE_SCAN_MAX_S, TREE_SCAN_MAX_S]
    assert next_tree_scan_s(20, TREE_SCAN_MAX_S, grew=True) == TREE_SCAN_S
