"""What ``guardian watch`` ticks in the guard loop, and when the watch ends.

Each tick samples liveness before reading, so a trainer seen gone has written all it will. The wait is injected
(tests run without sleeping). Failures as in ``guardian run``: ``config.tick_failure_limit`` in a row end the watch
with one ``event=guardian_cannot_continue`` line; an unreadable metrics path (``WatchError``) ends it at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from guardian.commands.watch.display import Display
from guardian.commands.watch.end import EndReason, FileState, WatchState, end_reason
from guardian.commands.watch.trainer import TrainerLiveness
from guardian.incidents.tick import IncidentTick, MetricsSource, TickResult
from guardian.logs import event, get_logger
from guardian.loop.guard import guard
from guardian.loop.outage import CannotContinue
from guardian.loop.pace import DrainPace
from guardian.loop.ticks import aside
from guardian.sinks.snapshot import GuardianSource
from guardian.sources.jsonl import MetricsBatch

log = get_logger("watch")
RESUME = "run the same guardian watch command again (it reads the file from its start; what is stored stays)"


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
    """A watch: ``run`` hands the guard loop this object to tick (``guard_loop.Ticking``) and says why it ended."""

    guardian: IncidentTick
    file: FollowedFile  # the guardian's metrics source
    trainer: TrainerLiveness  # sampled before each tick's read
    display: Display
    follow: bool
    total_steps: int | None
    wait: Callable[[float], bool]  # sleep up to the given seconds; True when asked to stop
    max_ticks: int | None = None
    # the run's published snapshots (``commands.outlets``); without them the watch publishes its own, from memory
    snapshots: GuardianSource | None = None
    announce: Callable[[CannotContinue], None] = lambda ending: None  # straight to the notifiers (commands.outlets)
    _ticks: int = field(default=0, init=False)
    _result: TickResult = field(default_factory=TickResult, init=False)

    @property
    def run_id(self) -> str:
        return self.guardian.run_id

    @property
    def busy(self) -> bool:
        """Bytes are left to read: the next tick comes at once."""
        return self.file.state is FileState.UNREAD

    def run(self) -> EndReason:
        g = self.guardian
        snapshots = self.snapshots or GuardianSource(g, g.store, g.clock, reads_store=False)
        try:
            reason = guard(
                self,
                pace=DrainPace(g.config.sources.poll_interval_s),
                wait=self._wait,
                failure_limit=g.config.tick_failure_limit,
                outage_limit_s=g.config.outage_limit_s,
                resume=RESUME,
                record_poll=snapshots,
                show=partial(self._show, snapshots),
                passthrough=(WatchError,),
            )
        except WatchError as exc:
            log.error(event("watch_error", {"run": self.run_id, "message": str(exc)}))
            reason = EndReason.UNREADABLE
        if reason is None and self._at_tick_limit:
            reason = EndReason.TICK_LIMIT
        elif reason is None:
            log.info(event("watch_interrupted", {"run": self.run_id}))
            reason = EndReason.INTERRUPTED
        aside(self.run_id, "display", lambda: self.display.finish(snapshots.latest))
        return reason

    def tick(self) -> EndReason | None:
        """One read of the file; why the watch ends after it, or None."""
        self._ticks += 1
        alive = self.trainer.sample()
        self.file.final = not self.follow or alive is False  # the writer is done: take a last partial line
        self._result = self.guardian.tick(trainer_alive=alive)
        return end_reason(
            WatchState(self.follow, self.file.state, self.guardian.history.last_step, self.total_steps, alive)
        )

    def cannot_continue(self, *, cause: str, fix: str) -> EndReason:
        """One line (and an alert straight to the notifiers): the watch ends, the run goes on unguarded."""
        trainer = "left running, UNGUARDED from now on (a watch never stops it)"
        fields = {"run": self.run_id, "cause": cause, "trainer": trainer, "fix": fix}
        log.critical(event("guardian_cannot_continue", fields))
        self.announce(CannotContinue(self.run_id, cause=cause, trainer=trainer, fix=fix))
        return EndReason.TICK_FAILURES

    def _show(self, snapshots: GuardianSource, ok: bool) -> None:
        """After a tick that worked: its result and the snapshot it published, with the file's state."""
        if ok:
            self.display.show(self._result, self.file.state, snapshots.latest)

    @property
    def _at_tick_limit(self) -> bool:
        return self.max_ticks is not None and self._ticks >= self.max_ticks

    def _wait(self, seconds: float) -> bool:
        """The loop's wait: ``--max-ticks`` ends the watch as a stop would (ticked that many times), without waiting."""
        return self._at_tick_limit or self.wait(seconds)
