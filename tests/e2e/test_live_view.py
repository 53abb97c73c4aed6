"""The live terminal view of ``guardian watch`` and ``guardian run``: checks worst first, a frame that fits 80x24
(what does not fit summarised), a header with the command, mode, attempt, trainer pid and ETA, and frames redrawn in
place on the alternate screen so the scrollback keeps one whole frame, never torn ones."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from fcntl import ioctl
from pathlib import Path

import pytest
from rich.console import Console

from guardian.commands.run import run_total_steps
from guardian.commands.screen import LiveScreen
from guardian.commands.view import Frame, Header, render
from guardian.core import Finding, Severity
from guardian.keys import Signal
from guardian.sinks.snapshot import RunSnapshot

ENTER_ALT, LEAVE_ALT = "\x1b[?1049h", "\x1b[?1049l"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
TRACE = Path(__file__).resolve().parents[2] / "guardian" / "data" / "aopd-2.jsonl"


def snapshot(checks: int = 24, *, critical: str = "zz_reward_hacking") -> RunSnapshot:
    """``checks`` checks judged ok, and one critical whose name sorts last."""
    findings = {
        f"check_{i:02d}": Finding(f"check_{i:02d}", Severity.OK, 120, "within its usual range " * 4)
        for i in range(checks - 1)
    }
    findings[critical] = Finding(critical, Severity.CRITICAL, 120, "reward rose while the judge disagreed", 96)
    findings["check_00"] = Finding("check_00", Severity.WARN, 120, "drifting", 110)
    return RunSnapshot(
        run_id="grpo-7b-run-with-a-long-name",
        experiment="grpo",
        attempt=2,
        step=120,
        steps_per_minute=2.0,
        last_step_age_seconds=12.0,
        signals={s: 0.5 for s in Signal},
        signal_steps={s: 120 for s in Signal},
        findings=findings,
    )


def drawn(renderable: object, width: int = 80, height: int = 24) -> list[str]:
    """The lines a terminal of ``width`` x ``height`` shows for ``renderable``."""
    console = Console(file=io.StringIO(), width=width, height=height, record=True, color_system=None)
    console.print(renderable)
    return console.export_text().rstrip("\n").split("\n")


def test_checks_are_shown_worst_first_and_the_frame_fits_80x24() -> None:
    header = Header("guardian run", "enforce", 4242, 1000)
    lines = drawn(Frame(lambda w, h: render(snapshot(), header=header, footer="no intervention", width=w, height=h)))
    assert len(lines) <= 24 and max(len(line) for line in lines) <= 80, lines
    rows = [line for line in lines if line.startswith(("check_", "zz_"))]
    assert rows[0].startswith("zz_reward_hacking") and "critical" in rows[0]  # critical first, though it sorts last
    assert rows[1].startswith("check_00") and "warn" in rows[1]
    hidden = next(line for line in lines if line.startswith("+"))
    assert re.fullmatch(r"\+\d+ more ok", hidden.strip()), hidden
    shown_or_hidden = len(rows) + int(hidden.split()[0][1:])
    assert shown_or_hidden == 24


def test_a_frame_holds_whatever_the_terminal_height_and_says_what_it_left_out() -> None:
    for height in (12, 16, 40):
        lines = drawn(render(snapshot(30), width=60, height=height), width=60, height=height)
        assert len(lines) <= height and max(map(len, lines)) <= 60
        assert any(line.startswith("zz_reward_hacking") for line in lines)


def test_the_header_says_command_mode_attempt_pid_and_eta() -> None:
    header = Header("guardian run", "enforce", 4242, 1000)
    first, second = drawn(render(snapshot(), header=header))[:2]
    assert first.startswith("guardian run grpo-7b-run-with-a-long-name")
    assert "mode enforce" in first and "attempt 2" in first and "pid 4242" in first
    # 880 steps left at 2 steps a minute
    assert "step 120/1000" in second and "ETA 7h 20m" in second
    unknown = drawn(render(snapshot(), header=Header("guardian watch", "observe")))[1]
    assert "ETA" not in unknown and "step 120 " in unknown + " "


def test_the_runs_total_steps_come_from_its_command() -> None:
    argv = ["python3", "-m", "verl.trainer.main_ppo", "trainer.total_training_steps=300", "trainer.save_freq=10"]
    assert run_total_steps(argv, Path.cwd()) == 300
    assert run_total_steps(["python3", "-m", "verl.trainer.main_ppo"], Path.cwd()) is None  # verl derives it


def test_frames_are_redrawn_in_place_on_the_alternate_screen_and_one_is_left() -> None:
    out = io.StringIO()
    console = Console(file=out, width=80, height=24, force_terminal=True, color_system=None)
    with LiveScreen(render(snapshot(), height=24), console) as screen:
        for step in range(121, 131):
            screen.update(Frame(lambda w, h, s=step: render(snapshot_at(s), width=w, height=h)))
    text = out.getvalue()
    assert text.startswith(ENTER_ALT) and text.count(LEAVE_ALT) == 1
    inside, after = text.split(LEAVE_ALT)
    assert "step 130" in after and after.count("guardian watch") == 1  # the last frame, once, whole
    assert len(ANSI.sub("", after).rstrip("\n").split("\n")) <= 24
    # every frame inside starts at the screen's top left corner: a redraw never scrolls
    frames = [f for f in inside.split("\x1b[H") if "guardian watch" in f]
    assert len(frames) >= 2 and all(f.count("guardian watch") == 1 for f in frames)


def snapshot_at(step: int) -> RunSnapshot:
    base = snapshot()
    return RunSnapshot(**{**{f: getattr(base, f) for f in base.__dataclass_fields__}, "step": step})


@pytest.mark.slow
def test_guardian_watch_on_a_terminal_leaves_one_whole_frame_in_the_scrollback(tmp_path: Path) -> None:
    """A real ``guardian watch`` on an 80x24 pseudo-terminal: frames on the alternate screen, one left after."""
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_bytes(TRACE.read_bytes())
    text, _ = read_terminal(
        [sys.executable, "-m", "guardian", "watch", "--metrics", str(metrics), "--run-id", "tty", "--no-follow"],
        {**os.environ, "GUARDIAN_HOME": str(tmp_path / "home")},
    )
    assert ENTER_ALT in text and LEAVE_ALT in text, text[-2000:]
    before, rest = text.split(ENTER_ALT, 1)
    _, after = rest.split(LEAVE_ALT, 1)
    assert "guardian watch tty" not in before  # nothing drawn outside the alternate screen before it
    plain = ANSI.sub("", after).replace("\r", "")
    assert plain.count("guardian watch tty") == 1  # one whole frame left, then the watch's summary
    frame = plain[plain.index("guardian watch tty") : plain.index("watch ended")].rstrip("\n").split("\n")
    assert "mode observe" in frame[0] and "critical" in frame[3]  # the worst check heads the table
    assert len(frame) <= 24 and all(len(line) <= 80 for line in frame)


def read_terminal(command: list[str], env: dict[str, str], timeout: float = 120) -> tuple[str, int]:
    """What ``command`` writes to an 80x24 pseudo-terminal until it exits, and its exit code."""
    parent, child = pty.openpty()
    ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES", "GUARDIAN_DB_URL")}
    proc = subprocess.Popen(command, stdin=child, stdout=child, stderr=child, env={**env, "TERM": "xterm-256color"})
    os.close(child)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([parent], [], [], 0.2)
            if ready:
                try:
                    data = os.read(parent, 65536)
                except OSError:  # the terminal closed: the command ended
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
    finally:
        if proc.poll() is None:
            proc.kill()
        code = proc.wait(timeout=30)
        os.close(parent)
    return b"".join(chunks).decode(errors="replace"), code


@pytest.mark.slow
def test_guardian_run_on_a_terminal_says_guardian_run_with_its_mode_attempt_pid_and_eta(tmp_path: Path) -> None:
    """A real ``guardian run`` of the demo trainer on an 80x24 pseudo-terminal."""
    trainer = [sys.executable, "-m", "guardian.demo.trainer", "trainer.total_training_steps=20"]
    trainer += ["trainer.total_epochs=1000", f"trainer.default_local_dir={tmp_path / 'ckpt'}"]
    trainer += ["+trainer.fault.slow_steps=0.1"]
    text, code = read_terminal(
        [sys.executable, "-m", "guardian", "run", "--run-id", "ttyrun", "--", *trainer],
        {**os.environ, "GUARDIAN_HOME": str(tmp_path / "home")},
    )
    assert code == 0, text[-3000:]
    assert ENTER_ALT in text and LEAVE_ALT in text, text[-3000:]
    inside = text.split(ENTER_ALT, 1)[1].split(LEAVE_ALT, 1)[0]
    plain = ANSI.sub("", inside)
    assert "guardian run ttyrun" in plain and "guardian watch" not in plain
    recorded = next((tmp_path / "home" / "runs" / "ttyrun").rglob("*.pid"))  # the wrapper's record of the trainer
    pid = json.loads(recorded.read_text())["pid"]
    assert f"mode enforce  attempt 1  pid {pid} " in plain, plain[-3000:]
    assert re.search(r"step \d+/20 .* ETA \d+", plain), plain[-3000:]
