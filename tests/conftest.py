"""Shared fixtures: the real verl files and public traces under tests/fixtures, and synthetic runs."""

from __future__ import annotations

import math
import os
import shutil
import socket
import sqlite3
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NoReturn

import pytest

from guardian.checks import CheckContext
from guardian.config import BaselineConfig
from guardian.history import RunHistory, StepRecord

# loopback stand-ins shared by several test modules (fixtures: receiver, fake_grafana)
pytest_plugins = ("webhook_receiver", "fake_grafana")

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"


@pytest.fixture(autouse=True)
def _outside_the_repository(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs in a fresh empty working directory: a relative path (verl's default checkpoint dir
    ``checkpoints/...``, a default output folder) never lands in the repository's tree."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


def missing(message: str) -> NoReturn:
    """Something a test needs is absent: skip locally with ``message``, fail in CI (where it must be there)."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


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
