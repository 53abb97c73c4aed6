"""The loop of ``guardian watch``: tick the guardian, show what happened, end when ``end_reason`` says so.

Each pass samples the trainer's liveness first, then reads: a trainer seen gone before a read has
written all it will, so once that read reaches the end of the file nothing is lost. The clock and the
wait are injected, so tests drive the loop through time without sleeping.

A tick that raises is handled as ``guardian run`` handles it (``guardian.outage.TickFailures``): the first
of a streak is logged with its traceback and the loop goes on; ``config.tick_failure_limit`` failures in
a row end the watch with one ``event=guardian_cannot_continue`` line. A watch only observes, so there is
no trainer to stop: the line says the run is unguarded from then on. An unreadable metrics path
(``WatchError``) is no passing fault: it ends the watch at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from guardian.daemon import Guardian, MetricsSource
from guardian.logs import event, get_logger
from guardian.notify.compose import Alert, cannot_continue_alert
from guardian.outage import TickFailures
from guardian.sources.jsonl import MetricsBatch
from guardian.ticks import GuardedTick
from guardian.watch.display import Display
from guardian.watch.end import EndReason, FileState, WatchState, end_reason
from guardian.watch.trainer import TrainerLiveness

log = get_logger("watch")


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
    after_tick: Callable[[bool], None] = lambda ok: None
    announce: Callable[[Alert], None] = lambda alert: None  # straight to the notifiers (Dispatcher.announce)

    def run(self) -> EndReason:
        guarded = GuardedTick(
            self.guardian.run_id, TickFailures(limit=self.guardian.config.tick_failure_limit), self.after_tick
        )
        ticks = 0
        while True:
            alive = self.trainer.sample()
            self.file.final = not self.follow or alive is False  # the writer is done: take a last partial line
            try:
                ok, result = guarded(self.guardian.tick, passthrough=(WatchError,))
            except WatchError as exc:
                log.error(event("watch_error", {"run": self.guardian.run_id, "message": str(exc)}))
                guarded.aside("display", self.display.finish)
                return EndReason.UNREADABLE
            ticks += 1
            if result is None:
                reason = EndReason.TICK_FAILURES if guarded.exhausted else None
            else:
                guarded.aside("display", partial(self.display.show, result, self.file.state))
                reason = end_reason(self._state(alive))
            if reason is None and self.max_ticks is not None and ticks >= self.max_ticks:
                reason = EndReason.TICK_LIMIT
            if reason is EndReason.TICK_FAILURES:
                self._give_up(guarded.cause())
            if reason is not None:
                guarded.aside("display", self.display.finish)
                return reason
            more = ok and self.file.state is FileState.UNREAD
            if self.wait(0.0 if more else self.guardian.config.sources.poll_interval_s):
                log.info(event("watch_interrupted", {"run": self.guardian.run_id}))
                guarded.aside("display", self.display.finish)
                return EndReason.INTERRUPTED

    def _state(self, alive: bool | None) -> WatchState:
        last = self.guardian.history.last_step
        return WatchState(self.follow, self.file.state, last, self.total_steps, alive)

    def _give_up(self, cause: str) -> None:
        """One line (and an alert straight to the notifiers): the watch ends, the run goes on unguarded."""
        trainer = "left running, UNGUARDED from now on (a watch never stops it)"
        fix = (
            "the traceback of event=tick_failed names the fault; fix it, then run the same guardian watch command "
            "again (it reads the file from its start; what is stored stays)"
        )
        fields = {"run": self.guardian.run_id, "cause": cause, "trainer": trainer, "fix": fix}
        log.critical(event("guardian_cannot_continue", fields))
        self.announce(cannot_continue_alert(self.guardian.run_id, cause=cause, trainer=trainer, fix=fix))
