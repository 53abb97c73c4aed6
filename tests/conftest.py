"""Shared fixtures: the real verl files under ../shared, and synthetic runs."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from guardian.checks import CheckContext
from guardian.config import BaselineConfig
from guardian.history import RunHistory, StepRecord

# loopback stand-ins shared by several test modules (fixtures: receiver, fake_grafana)
pytest_plugins = ("webhook_receiver", "fake_grafana")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def shared_path(*parts: str) -> Path:
    """A file under ../shared; skips locally when absent, fails in CI (where it must be present)."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        message = f"{path} not found (the shared/ folder beside the repository)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def history_of(rows: Iterable[Mapping[str, float | None]], start: int = 1) -> RunHistory:
    """A history from per-step dicts (None = non-finite, as verl writes null)."""
    h = RunHistory()
    for offset, row in enumerate(rows):
        data = {k: (math.nan if v is None else float(v)) for k, v in row.items()}
        h.add(StepRecord(start + offset, data))
    return h


def context(h: RunHistory, now: float | None = None, started_at: float | None = None) -> CheckContext:
    return CheckContext(h, BaselineConfig(), now=now, started_at=started_at)
