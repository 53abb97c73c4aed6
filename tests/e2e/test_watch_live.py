"""``guardian watch`` as a real process while a writer appends, truncates and rewrites the metrics
file the way verl does (every trainer start truncates it), then Ctrl-C: it ends with its summary."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from importlib.resources import files
from pathlib import Path

from guardian.store import Store

TRACE = files("guardian.data").joinpath("aopd-2.jsonl").read_bytes().splitlines(keepends=True)


def wait_for(predicate: object, timeout: float = 30.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def test_watch_follows_append_truncate_rewrite_and_exits_cleanly(tmp_path: Path) -> None:
    home = tmp_path / "home"
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.parent.mkdir()
    env = {**os.environ, "GUARDIAN_HOME": str(home)}
    env.pop("GUARDIAN_DB_URL", None)
    metrics.write_bytes(b"")
    proc = subprocess.Popen(
        [sys.executable, "-m", "guardian", "watch", "--metrics", str(metrics), "--run-id", "live", "--no-live"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    db = f"sqlite:///{home / 'guardian.db'}"
    try:
        # first launch: 25 steps, the last line written in two halves
        with metrics.open("ab", buffering=0) as out:
            for line in TRACE[:25]:
                out.write(line)
            out.write(TRACE[25][:40])
            time.sleep(0.6)
            out.write(TRACE[25][40:])
        wait_for(lambda: (home / "guardian.db").exists())
        with Store.open(db) as store:
            wait_for(lambda: store.count_steps("live") >= 26)
        # the trainer restarts: verl truncates the file, logs validation-before-train, then the steps
        with metrics.open("wb", buffering=0) as out:
            out.write(b'{"step":0,"data":{"val-core/hotpotqa/acc/mean@1":0.31}}\n')
            for line in TRACE[1:]:
                out.write(line)
                time.sleep(0.005)
        with Store.open(db) as store:
            wait_for(lambda: store.count_steps("live") == 60)
    finally:
        proc.send_signal(signal.SIGINT)
        out_text, err_text = proc.communicate(timeout=20)
    assert proc.returncode == 3, err_text.decode()[-2000:]  # a critical finding was seen: unhealthy
    out = out_text.decode()
    assert "watch ended: interrupted" in out and "verdict: UNHEALTHY from step" in out
    assert "critical  length_collapse  escalated" in out  # piped: a plain line per finding
    with Store.open(db) as store:
        attempts = store.latest_attempt("live")
        assert attempts is not None and attempts.number == 2  # the truncation began a second attempt
        incident = next(i for i in store.list_incidents("live") if i.check == "length_collapse")
        assert incident.onset_step is not None and 20 <= incident.onset_step <= 36
    assert b"event=watch_stopped" in err_text
    assert b"Traceback" not in err_text
