"""How long the guard loop waits before its next tick. Pure: told whether the tick worked and whether it saw
something move, it says the wait in seconds. ``PollPace`` (``run``) backs off while the run is quiet;
``DrainPace`` (``watch``) reads on at once while bytes are left, else every interval."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from guardian.backoff import Backoff


class Pace(Protocol):
    def next_wait(self, *, ok: bool, busy: bool) -> float: ...


@dataclass
class PollPace:
    """The wait before the next tick: ``base_s`` while anything moves (a new line, an intervention state it acts in, a
    failed tick), doubling on each quiet tick up to ``idle_max_s``. A run that logs a step every few seconds is
    then polled a few times per step instead of every ``base_s``, and a new step is still seen within
    ``idle_max_s``."""

    base_s: float
    idle_max_s: float
    _quiet: Backoff = field(init=False)

    def __post_init__(self) -> None:
        self._quiet = Backoff(self.base_s, max(self.idle_max_s, self.base_s))

    def next_wait(self, *, ok: bool, busy: bool) -> float:
        if busy or not ok:
            self._quiet.reset()
        return self._quiet.next_delay()


@dataclass(frozen=True, slots=True)
class DrainPace:
    """No wait after a tick that worked and left bytes to read (``busy``): a file far ahead is read through at
    once; otherwise - at its end, or after a failed tick - ``interval_s``."""

    interval_s: float

    def next_wait(self, *, ok: bool, busy: bool) -> float:
        return 0.0 if ok and busy else self.interval_s
