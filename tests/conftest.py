"""Shared fixtures: the real verl files and public traces under tests/fixtures, and synthetic runs."""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NoReturn

import pytest

from guardian.checks import CheckContext
from guardian.config import BaselineConfig
from guardian.core import StepRecord
from guardian.history.timeline import RunHistory

# loopback stand-ins shared by several test modules (fixtures: receiver, fake_grafana), and a real PostgreSQL
# (fixtures: postgres, db_url)
pytest_plugins = ("webhook_receiver", "fake_grafana", "postgres_server")

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"


@pytest.fixture(autouse=True)
def _outside_the_repository(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs in a fresh empty working directory: a relative path (verl's default checkpoint dir
    ``checkpoints/...``, a default output folder) never lands in the repository's tree."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.fixture(autouse=True)
def _away_from_the_users_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reads or writes the real user's guardian home or store (guardian/home.py): GUARDIAN_HOME and
    GUARDIAN_DB_URL are unset (a test that wants one sets it), the per-user state folder is a fresh temporary one, and
    the search for a ``.guardian/`` stops at pytest's temporary folder (a stray ``/tmp/.guardian`` is never found)."""
    monkeypatch.delenv("GUARDIAN_HOME", raising=False)
    monkeypatch.delenv("GUARDIAN_DB_URL", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
    monkeypatch.setenv("GUARDIAN_CEILING_DIRECTORIES", str(tmp_path_factory.getbasetemp()))


def missing(message: str) -> NoReturn:
    """Something a test needs is absent: skip locally with ``message``, fail in CI (where it must be there)."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


VERL_VERSION = "0.9.1"


def verl_package() -> Path:
    """verl 0.9.1's installed package folder, found without running verl/__init__.py (which imports torch):
    ``pip install --no-deps verl==0.9.1`` is enough for its config tree and source (the Makefile does it)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        missing(f"verl is not installed (these tests need: pip install --no-deps verl=={VERL_VERSION} hydra-core)")
    root = Path(next(iter(spec.submodule_search_locations)))
    assert (root / "version" / "version").read_text().strip() == VERL_VERSION
    return root


def fixture_path(*parts: str) -> Path:
    """A file under tests/fixtures (real verl 0.9.1 output and public traces; sources in its README)."""
    path = FIXTURES.joinpath(*parts)
    assert path.exists(), f"fixture {path} is missing from the repository"
    return path


def required_tool(name: str, package: str) -> str:
    """The path of the command ``name``; skips locally when absent, fails in CI (.ci/run installs ``package``)."""
    found = shutil.which(name)
    if found is None:
        missing(f"{name} not on PATH (Debian package {package}; .ci/run installs it)")
    return found


def corrupt_table(db: Path, table: str = "steps") -> None:
    """Overwrite the root page of ``table`` in a guardian SQLite file (after moving the WAL into the file)
    with garbage: connections opened afterwards fail to read or write it ("database disk image is
    malformed")."""
    with sqlite3.connect(db) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        (root,) = connection.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()
        (size,) = connection.execute("PRAGMA page_size").fetchone()
    with db.open("r+b") as handle:
        handle.seek((root - 1) * size)
        handle.write(b"\xa5" * size)


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (nothing listens there: also a closed port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RetrievalServer:
    """``python -m recipe.search.server`` over ``index`` on a free loopback port, as a context manager: entered once
    ``/health`` answers; on exit it is stopped (SIGTERM) and ``log`` holds what it wrote to stderr."""

    def __init__(self, index: Path, timeout_s: float = 120.0) -> None:
        self.index, self.timeout_s = index, timeout_s
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/retrieve"
        self.log = ""

    def __enter__(self) -> RetrievalServer:
        import httpx

        argv = [sys.executable, "-m", "recipe.search.server", "--index", str(self.index), "--port", str(self.port)]
        self.process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + self.timeout_s
        while True:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"the retrieval server never answered /health:\n{self.log}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        _, self.log = self.process.communicate(timeout=30)


class ManualClock:
    """A clock tests move by hand (``clock.now = ...``)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def history_of(rows: Iterable[Mapping[str, float | None]], start: int = 1) -> RunHistory:
    """A history from per-step dicts (None = non-finite, as verl writes null)."""
    h = RunHistory()
    for offset, row in enumerate(rows):
        data = {k: (math.nan if v is None else float(v)) for k, v in row.items()}
        h.add(StepRecord(start + offset, data))
    return h


def context(
    h: RunHistory, now: float | None = None, started_at: float | None = None, trainer_alive: bool | None = None
) -> CheckContext:
    return CheckContext(h, BaselineConfig(), now=now, started_at=started_at, trainer_alive=trainer_alive)


def guarded_demo(home: Path, scenario: str) -> Path:
    """``guardian demo --scenario SCENARIO`` (the real tiny GRPO trainer under the supervisor, enforce mode) with
    its store and run folders under ``home``; returns ``home``."""
    env = {**os.environ, "GUARDIAN_HOME": str(home)}
    env.pop("GUARDIAN_DB_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "guardian", "--log-level", "ERROR", "demo", "--scenario", scenario],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return home


@pytest.fixture(scope="session")
def demo_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default demo, run once per session: an entropy collapse stopped, rolled back, patched and resolved."""
    return guarded_demo(tmp_path_factory.mktemp("demo-home"), "entropy_collapse")


@pytest.fixture(scope="session")
def healthy_demo_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The healthy demo scenario, run once per session: 300 steps, no incident, checkpoints every 50."""
    return guarded_demo(tmp_path_factory.mktemp("healthy-home"), "healthy")


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> pytest.LogCaptureFixture:
    """The guardian's log records (the CLI's set-up turns their propagation off; this turns it back on)."""
    monkeypatch.setattr(logging.getLogger("guardian"), "propagate", True)
    caplog.set_level(logging.INFO, logger="guardian")
    return caplog


def events(logs: pytest.LogCaptureFixture, name: str) -> list[str]:
    """The messages of the ``event=NAME`` lines logged."""
    return [r.getMessage() for r in logs.records if r.getMessage().startswith(f"event={name} ")]
