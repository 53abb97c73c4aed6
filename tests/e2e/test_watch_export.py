"""`guardian watch --export PORT` as a process: it serves the exporter while it guards and says it is down before
it goes (the exporter in process: tests/integration/test_sinks_prometheus.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from importlib.resources import files
from pathlib import Path

from conftest import free_port
from prometheus_client.parser import text_string_to_metric_families

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def series_of(text: str) -> Series:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_watch_serves_metrics_while_it_guards(tmp_path: Path) -> None:
    """`guardian watch --export PORT` end to end: a real watch process, scraped over loopback."""
    port = free_port()
    trace = tmp_path / "metrics.jsonl"
    trace.write_bytes(files("guardian.data").joinpath("aopd-2.jsonl").read_bytes())
    env = {**os.environ, "GUARDIAN_HOME": str(tmp_path / "home")}
    env.pop("GUARDIAN_DB_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "guardian", "watch", "--metrics", str(trace), "--no-live", "--export", str(port)],
        env=env,
        stderr=subprocess.PIPE,
    )
    try:
        text = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "guardian_step{" not in text:
            time.sleep(0.3)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                    text = response.read().decode()
            except OSError:
                continue
        assert 'guardian_check_status{check="length_collapse"' in text
        assert "guardian_up{" in text and "guardian_incidents_total{" in text
        proc.send_signal(signal.SIGINT)  # stop watching: the exporter says so before it goes
        deadline = time.monotonic() + 15

        def up() -> list[float]:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            return [value for (name, _), value in series_of(text).items() if name == "guardian_up"]

        while up() != [0.0]:
            assert time.monotonic() < deadline, "guardian_up never turned 0 after SIGINT"
            time.sleep(0.1)
        assert proc.poll() is None  # still lingering
    finally:
        proc.send_signal(signal.SIGINT)  # a second signal ends the linger
        proc.communicate(timeout=20)
