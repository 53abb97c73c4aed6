"""Real Prometheus (Debian's ``prometheus`` 2.42) and Alertmanager (``prometheus-alertmanager`` 0.25) servers
on loopback for end-to-end tests.

``running_prometheus`` / ``running_alertmanager`` write a config into a scratch folder, start the server with
its storage there, wait for ``/-/ready`` and stop it afterwards; ``Prometheus`` wraps the few HTTP API calls the
tests make. ``conftest.required_tool`` skips a test locally when a server is missing and fails it under CI (env ``CI``).
"""

from __future__ import annotations

import json
import signal
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
from conftest import free_port, required_tool


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
    port = free_port()
    config_file = _write_config(folder, "prometheus.yml", config)
    command = [
        required_tool("prometheus", "prometheus"),
        f"--config.file={config_file}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    with _serving(command, folder / "prometheus.log", f"http://127.0.0.1:{port}", ready_timeout) as process:
        yield Prometheus(f"http://127.0.0.1:{port}", process, folder / "prometheus.log")


@contextmanager
def running_alertmanager(folder: Path, config: Mapping[str, Any], *, ready_timeout: float = 30.0) -> Iterator[str]:
    """Run Debian's ``prometheus-alertmanager`` with ``config`` on a free loopback port (no clustering); yields
    its ``host:port`` once ready."""
    port = free_port()
    config_file = _write_config(folder, "alertmanager.yml", config)
    command = [
        required_tool("prometheus-alertmanager", "prometheus-alertmanager"),
        f"--config.file={config_file}",
        f"--storage.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
        "--log.level=warn",
    ]
    with _serving(command, folder / "alertmanager.log", f"http://127.0.0.1:{port}", ready_timeout):
        yield f"127.0.0.1:{port}"


def _write_config(folder: Path, name: str, config: Mapping[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    return path


@contextmanager
def _serving(command: list[str], log: Path, url: str, ready_timeout: float) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_ready(process, url, log, ready_timeout)
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def _wait_ready(process: subprocess.Popen[bytes], url: str, log: Path, timeout: float) -> None:
    name = Path(str(process.args[0] if isinstance(process.args, list) else process.args)).name
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{name} exited with {process.returncode}:\n{log.read_text(errors='replace')[-4000:]}")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    pytest.fail(f"{name} not ready after {timeout:.0f} s:\n{log.read_text(errors='replace')[-4000:]}")
