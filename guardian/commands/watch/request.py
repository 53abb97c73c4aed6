"""What ``guardian watch`` was asked to follow, as the CLI read it from its arguments (checked there)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class WatchRequest:
    path: Path  # the metrics file, or with ``console`` the run's stdout log
    run_id: str
    console: bool = False
    rollouts: Path | None = None
    checkpoints: Path | None = None
    follow: bool = True
    pid: int | None = None
    total_steps: int | None = None
    live: bool = False  # the live table (a terminal), else plain lines
    max_ticks: int | None = None
