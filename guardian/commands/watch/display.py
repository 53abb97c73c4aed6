"""How ``guardian watch`` shows the run while it reads: the live table on a terminal, else plain lines.

``show`` runs after every tick that worked, ``finish`` once at the end; a failure of either is logged, never fatal.
The content is formatted by ``guardian.commands.view``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from rich.console import Console

from guardian.commands.screen import LiveScreen
from guardian.commands.view import WATCH_HEADER, Frame, Header, finding_line, progress_line, render
from guardian.commands.watch.end import FileState
from guardian.core import Clock
from guardian.incidents.tick import IncidentTick, TickResult
from guardian.sinks.snapshot import RunSnapshot

# plain progress: a line once this many steps arrived since the last one, or this long after it
PROGRESS_EVERY_STEPS = 10
PROGRESS_EVERY_SECONDS = 30.0


class Display(Protocol):
    """Shows the watch: after every tick, with the file's state, and once at the end."""

    def show(self, result: TickResult, file: FileState, snapshot: RunSnapshot) -> None: ...

    def finish(self, snapshot: RunSnapshot) -> None: ...


@dataclass
class PlainProgress:
    """Plain lines for a pipe or a log file: "waiting for FILE" once, a line per finding raised, escalated,
    eased or cleared, and a progress line every ``every_steps`` steps or ``every_seconds`` (with news), and
    one at the end for the steps not shown yet."""

    guardian: IncidentTick
    out: Callable[[str], None]
    clock: Clock
    every_steps: int = PROGRESS_EVERY_STEPS
    every_seconds: float = PROGRESS_EVERY_SECONDS
    _waited: bool = False
    _unshown_steps: int = 0
    _shown_at: float | None = None

    def show(self, result: TickResult, file: FileState, snapshot: RunSnapshot) -> None:
        if file is FileState.MISSING and not self._waited:
            self.out(f"waiting for {self.guardian.metrics.path}")
            self._waited = True
        for transition in result.transitions:
            self.out(finding_line(transition))
        self._unshown_steps += result.new_steps
        now = self.clock()
        if self._shown_at is None:
            self._shown_at = now
        late = now - self._shown_at >= self.every_seconds
        if self._unshown_steps >= self.every_steps or (self._unshown_steps and late):
            self._progress(now, snapshot)

    def finish(self, snapshot: RunSnapshot) -> None:
        if self._unshown_steps:
            self._progress(self.clock(), snapshot)

    def _progress(self, now: float, snapshot: RunSnapshot) -> None:
        self.out(progress_line(snapshot))
        self._unshown_steps = 0
        self._shown_at = now


class LiveView:
    """The live terminal view, drawn from ``first`` (the snapshot published before the first tick), then redrawn in
    place after every tick on the alternate screen (``guardian.commands.screen``), at the terminal's size."""

    def __init__(
        self, guardian: IncidentTick, first: RunSnapshot, header: Header = WATCH_HEADER, console: Console | None = None
    ) -> None:
        self.guardian = guardian
        self.header = header
        self._screen = LiveScreen(self._frame(first, ""), console)

    def _frame(self, snapshot: RunSnapshot, note: str) -> Frame:
        return Frame(lambda width, height: render(snapshot, note, header=self.header, width=width, height=height))

    def __enter__(self) -> LiveView:
        self._screen.__enter__()
        return self

    def __exit__(self, *_: object) -> None:
        self._screen.__exit__()

    def show(self, result: TickResult, file: FileState, snapshot: RunSnapshot) -> None:
        note = f"waiting for {self.guardian.metrics.path}" if file is FileState.MISSING else ""
        self._screen.update(self._frame(snapshot, note))

    def finish(self, snapshot: RunSnapshot) -> None:
        pass  # the last tick drew its snapshot already; leaving the screen prints it once
