"""``guardian demo --export PORT`` as a real process: it says what it serves and for how long after the run instead
of falling silent, and Ctrl-C (during the run, then during the linger) prints the summary and exits cleanly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_demo_export_says_what_it_serves_and_ctrl_c_ends_it_with_its_summary(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "GUARDIAN_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    env.pop("GUARDIAN_DB_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "guardian", "demo", "--scenario", "healthy", "--export", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    lines: list[str] = []
    seen = threading.Event()
    serving = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.lstrip().startswith("step "):
                seen.set()
            if "serving the final state" in line:
                serving.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert seen.wait(120), "".join(lines)  # the run is under way
        proc.send_signal(signal.SIGINT)  # the first Ctrl-C stops the run: the summary, then the linger says so
        assert serving.wait(60), "".join(lines)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)  # the second ends the linger at once
        proc.wait(timeout=30)
        assert time.monotonic() - started < 10
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(timeout=10)
        assert proc.stdout is not None and proc.stderr is not None
        err = proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
    out = "".join(lines)
    assert proc.returncode == 130, out + err
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err
    assert f"metrics: http://127.0.0.1:{port}/metrics" in out
    assert "interrupted at step" in out and "history: sqlite:///" in out
    assert out.index("history: sqlite:///") < out.index("serving the final state")  # the summary comes first
    assert f"serving the final state on http://127.0.0.1:{port}/metrics for 75 s more" in out and "Ctrl-C" in out
