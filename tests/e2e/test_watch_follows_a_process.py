"""`guardian watch --pid` as a process following a real writer process: the watch ends when the trainer exits,
with the findings and the summary on its plain output (the watch's end rules in process:
tests/integration/test_watch_end.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import fixture_path

RUN_30 = fixture_path("verl-0.9.1-run", "metrics-30-steps.jsonl")  # steps 0-30, entropy collapses from ~16


WRITER = """
import sys, time
lines = open(sys.argv[1], "rb").read().splitlines(keepends=True)
with open(sys.argv[2], "ab", buffering=0) as out:
    for line in lines:
        out.write(line)
        time.sleep(0.05)
"""


@pytest.mark.slow
def test_following_a_real_trainer_process_ends_when_it_exits(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    env = {**os.environ, "GUARDIAN_HOME": str(tmp_path / "home")}
    env.pop("GUARDIAN_DB_URL", None)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(RUN_30), str(metrics)])
    try:
        watch = subprocess.run(
            [sys.executable, "-m", "guardian", "watch", "--metrics", str(metrics), "--pid", str(writer.pid)],
            env=env,
            capture_output=True,
            timeout=120,
        )
    finally:
        writer.wait(timeout=30)
    out = watch.stdout.decode()
    assert watch.returncode == 3, watch.stderr.decode()[-2000:]
    assert f"watch ended: the trainer process {writer.pid} exited" in out
    assert "steps read: 31 (last step 30)" in out
    # piped: plain lines - the findings as they come, progress every 10 steps or 30 s, the summary
    assert "step 24  critical  entropy_collapse  raised" in out
    assert any(line.startswith("step 30  reward 0.552  entropy 0.865") for line in out.splitlines())
    assert b"Traceback" not in watch.stderr
