"""A real Prometheus server (Debian's ``prometheus`` 2.42) on loopback for end-to-end tests.

``running_prometheus`` writes a config into a scratch folder, starts ``prometheus`` with its TSDB there,
waits for ``/-/ready`` and stops it afterwards; ``Prometheus`` wraps the few HTTP API calls the tests make.
``prometheus_binary`` skips a test locally when the binary is missing and fails it under CI (env ``CI``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml


def prometheus_binary() -> str:
    """The ``prometheus`` binary; skips the test when absent (fails it under CI, where .ci/run installs it)."""
    found = shutil.which("prometheus")
    if found is None:
        message = "prometheus not on PATH (Debian package prometheus; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rules_with_hold(source: Path, dest: Path, hold: str) -> list[str]:
    """Copy the rule file ``source`` to ``dest`` with every ``for:`` set to ``hold``; nothing else changes.
    Returns the alert names."""
    document = yaml.safe_load(source.read_text())
    names = []
    for group in document["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = hold
            if "alert" in rule:
                names.append(str(rule["alert"]))
    dest.write_text(yaml.safe_dump(document, sort_keys=False))
    return names


@dataclass
class Prometheus:
    """A started server: ``url`` (``http://127.0.0.1:PORT``), its process and its log file."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def api(self, path: str, **params: str | float) -> Any:
        """GET ``/api/v1/<path>`` and return its ``data``; fails the test with Prometheus's error otherwise."""
        query = urllib.parse.urlencode({k: str(v) for k, v in params.items()})
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as error:
            body = json.loads(error.read() or b"{}")
        if body.get("status") != "success":
            pytest.fail(f"Prometheus /api/v1/{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float) -> Any:
        """An instant query at Unix time ``at``: ``{"resultType": ..., "result": [...]}``."""
        return self.api("query", query=expr, time=at)

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict[str, Any]]:
        """A range query: one ``{"metric": labels, "values": [[t, "v"], ...]}`` per series."""
        data = self.api("query_range", query=expr, start=start, end=end, step=step)
        return list(data["result"])

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


@contextmanager
def running_prometheus(folder: Path, config: Mapping[str, Any], *, ready_timeout: float = 30.0) -> Iterator[Prometheus]:
    """Run ``prometheus`` with ``config`` (written to ``folder/prometheus.yml``) on a free loopback port, its TSDB
    under ``folder/data``; yields once ``/-/ready`` answers 200 and stops the server on exit."""
    binary = prometheus_binary()
    folder.mkdir(parents=True, exist_ok=True)
    config_file = folder / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    port = free_port()
    log = folder / "prometheus.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config_file}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Prometheus(f"http://127.0.0.1:{port}", process, log)
    try:
        _wait_ready(server, ready_timeout)
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def _wait_ready(server: Prometheus, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            pytest.fail(f"prometheus exited with {server.process.returncode}:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    pytest.fail(f"prometheus not ready after {timeout:.0f} s:\n{server.log_tail()}")
