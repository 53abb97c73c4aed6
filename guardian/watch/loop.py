"""The loop of ``guardian watch``: tick the guardian, show what happened, end when ``watch_end`` says so.

Each pass samples the trainer's liveness first, then reads: a trainer seen gone before a read has
written all it will, so once that read reaches the end of the file nothing is lost. The clock and the
wait are injected, so tests drive the loop through time without sleeping.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from rich.console import Group
from rich.live import Live

from guardian.daemon import Clock, Guardian, MetricsSource, TickResult
from guardian.logs import event, get_logger
from guardian.sources.jsonl import MetricsBatch
from guardian.trainer_pid import TrainerLiveness
from guardian.view import finding_line, progress_line, render
from guardian.watch_end import EndReason, FileState, WatchState, end_reason

log = get_logger("watch")
# plain progress: a line once this many steps arrived since the last one, or this long after it
PROGRESS_EVERY_STEPS = 10
PROGRESS_EVERY_SECONDS = 30.0


class WatchError(Exception):
    """The watched path cannot be read (a directory, no permission); the message names it."""


@dataclass
class FollowedFile:
    """The metrics source as the loop reads it: what the last poll left (``state``), and ``final`` to take
    an unterminated last line too (the writer is done)."""

    inner: MetricsSource
    final: bool = False
    state: FileState = FileState.MISSING

    @property
    def path(self) -> Path:
        return self.inner.path

    def poll(self, *, final: bool = False) -> MetricsBatch:
        try:
            batch = self.inner.poll(final=final or self.final)
            exists = self.path.exists()
        except OSError as exc:
            raise WatchError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        if batch.more:
            self.state = FileState.UNREAD
        else:
            self.state = FileState.AT_END if exists or batch.items else FileState.MISSING
        return batch


class Display(Protocol):
    """Shows the watch: after every tick, with the file's state, and once at the end."""

    def show(self, result: TickResult, file: FileState) -> None: ...

    def finish(self) -> None: ...


@dataclass
class PlainProgress:
    """Plain lines for a pipe or a log file: "waiting for FILE" once, a line per finding raised, escalated,
    eased or cleared, and a progress line every ``every_steps`` steps or ``every_seconds`` (with news), and
    one at the end for the steps not shown yet."""

    guardian: Guardian
    out: Callable[[str], None]
    clock: Clock
    every_steps: int = PROGRESS_EVERY_STEPS
    every_seconds: float = PROGRESS_EVERY_SECONDS
    _waited: bool = False
    _unshown_steps: int = 0
    _shown_at: float | None = None

    def show(self, result: TickResult, file: FileState) -> None:
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
            self._progress(now)

    def finish(self) -> None:
        if self._unshown_steps:
            self._progress(self.clock())

    def _progress(self, now: float) -> None:
        self.out(progress_line(self.guardian.history, self.guardian.tracker))
        self._unshown_steps = 0
        self._shown_at = now


class LiveView:
    """The live terminal table (rich), redrawn after every tick."""

    def __init__(self, guardian: Guardian, clock: Clock) -> None:
        self.guardian = guardian
        self.clock = clock
        self._live = Live(self._render(""), refresh_per_second=4)

    def __enter__(self) -> LiveView:
        self._live.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._live.stop()

    def show(self, result: TickResult, file: FileState) -> None:
        self._live.update(
            self._render(f"waiting for {self.guardian.metrics.path}" if file is FileState.MISSING else "")
        )

    def finish(self) -> None:
        self._live.refresh()

    def _render(self, note: str) -> Group:
        g = self.guardian
        return render(g.run_id, g.history, g.tracker, self.clock(), note)


@dataclass
class WatchLoop:
    guardian: Guardian
    file: FollowedFile  # the guardian's metrics source
    trainer: TrainerLiveness  # the guardian's trainer_alive
    display: Display
    follow: bool
    total_steps: int | None
    wait: Callable[[float], bool]  # sleep up to the given seconds; True when asked to stop
    max_ticks: int | None = None
    after_tick: Callable[[], None] = lambda: None
    steps_read: int = field(default=0, init=False)

    def run(self) -> EndReason:
        ticks = 0
        while True:
            alive = self.trainer.sample()
            self.file.final = not self.follow or alive is False  # the writer is done: take a last partial line
            result = self.guardian.tick()
            ticks += 1
            self.steps_read += result.new_steps
            self.after_tick()
            self.display.show(result, self.file.state)
            state = WatchState(self.follow, self.file.state, self.guardian.history.last_step, self.total_steps, alive)
            reason = end_reason(state)
            if reason is None and self.max_ticks is not None and ticks >= self.max_ticks:
                reason = EndReason.TICK_LIMIT
            if reason is not None:
                self.display.finish()
                return reason
            pause = 0.0 if state.file is FileState.UNREAD else self.guardian.config.sources.poll_interval_s
            if self.wait(pause):
                log.info(event("watch_interrupted", {"run": self.guardian.run_id}))
                self.display.finish()
                return EndReason.INTERRUPTED
