"""Pure decisions for a guardian whose store refuses writes or whose ticks keep failing; no IO.

- Store down: a collapsing trainer is still stopped (enforce); everything after the stop waits for the store,
  and once no trainer runs, the guardian gives up after ``STORE_WAIT_S``.
- Failing ticks: give up after ``TICK_FAILURE_LIMIT`` in a row, or after ``OUTAGE_LIMIT_S`` when all were outages.
- Giving up: one ``event=guardian_cannot_continue`` line (cause, trainer, what to do) and ``EXIT_ERROR``."""

from __future__ import annotations

from dataclasses import dataclass

from guardian.config import OUTAGE_LIMIT_S, STORE_WAIT_S, TICK_FAILURE_LIMIT


@dataclass(frozen=True, slots=True)
class CannotContinue:
    """The guardian stops guarding ``run_id``: why (``cause``), what became of its trainer and what to do (``fix``).
    Told straight to the notifiers (``commands.outlets``), past the store: the store may be the trouble."""

    run_id: str
    cause: str
    trainer: str
    fix: str


def stop_while_store_down(*, mode: str, running: bool, collapsing: bool) -> bool:
    """Whether to stop the trainer now, the store being unavailable."""
    return mode == "enforce" and running and collapsing


def trainer_fate(*, mode: str, running: bool, collapsing: bool) -> str:
    """What a guardian that gives up does with the trainer: ``stop``, ``leave`` (unguarded) or ``none``."""
    if not running:
        return "none"
    return "stop" if mode == "enforce" and collapsing else "leave"


@dataclass
class StoreWait:
    """How long the run has needed a store that refuses writes (it needs it once no trainer runs)."""

    limit_s: float = STORE_WAIT_S
    since: float | None = None

    def update(self, *, needed: bool, now: float) -> bool:
        """Note whether the store is needed at ``now``; True once it has been needed past the limit."""
        if not needed:
            self.since = None
            return False
        if self.since is None:
            self.since = now
        return now - self.since > self.limit_s

    def waited(self, now: float) -> float:
        return now - self.since if self.since is not None else 0.0


@dataclass
class TickFailures:
    """Failed ticks in a row, and when the streak began. A streak of outages only (each passes on its own: the
    network, a cluster's API, a server that does not answer) is given ``outage_limit_s``; a streak with a bug in
    it ends after ``limit`` ticks."""

    limit: int = TICK_FAILURE_LIMIT
    outage_limit_s: float = OUTAGE_LIMIT_S
    count: int = 0
    outages_only: bool = True
    since: float = 0.0
    last: float = 0.0

    def failed(self, *, outage: bool = False, now: float = 0.0) -> bool:
        """Count a failed tick at ``now``; True for the first of a streak (the one to log with its traceback)."""
        self.count += 1
        if self.count == 1:
            self.since, self.outages_only = now, outage
        self.outages_only = self.outages_only and outage
        self.last = now
        return self.count == 1

    @property
    def exhausted(self) -> bool:
        if self.count < self.limit:
            return False
        return not self.outages_only or self.last - self.since > self.outage_limit_s

    def succeeded(self) -> int:
        """A tick went through: the streak ends; returns how many ticks it had failed."""
        failed, self.count = self.count, 0
        return failed
