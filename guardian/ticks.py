"""One tick of a guard loop (``guardian run``'s and ``guardian watch``'s), guarded.

A tick that raises is logged once per streak with its traceback (``event=tick_failed``) and the loop goes on;
the first tick that works again says so (``event=tick_recovered``); ``outage.TickFailures`` tells when a streak
is long enough to give up. ``PollPace`` says how long to wait before the next tick. Whatever follows a tick -
the exporter's poll status, a terminal view - is a side show: its failure is logged, never counted as a failed
tick, and never loses the tick's result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from guardian.logs import event, get_logger
from guardian.outage import TickFailures, failure_text

log = get_logger("ticks")
T = TypeVar("T")


@dataclass
class GuardedTick:
    run_id: str
    failures: TickFailures
    after_tick: Callable[[bool], None] = lambda ok: None  # the exporter's poll status, after every tick
    last_error: str = ""

    def __call__(
        self, tick: Callable[[], T], *, passthrough: tuple[type[Exception], ...] = ()
    ) -> tuple[bool, T | None]:
        """Run ``tick``: (True, its result), or (False, None) when it raised (``passthrough`` exceptions are
        re-raised: they end the loop on purpose)."""
        try:
            result = tick()
        except passthrough:
            raise
        except Exception as exc:
            self.last_error = failure_text(exc)
            if self.failures.failed():
                fields = {"run": self.run_id, "error": self.last_error, "next": "retrying every tick"}
                log.error(event("tick_failed", fields), exc_info=True)
            self.aside("exporter", lambda: self.after_tick(False))
            return False, None
        if self.failures.count:
            log.warning(event("tick_recovered", {"run": self.run_id, "failed_ticks": self.failures.succeeded()}))
        self.aside("exporter", lambda: self.after_tick(True))
        return True, result

    @property
    def exhausted(self) -> bool:
        return self.failures.exhausted

    def cause(self) -> str:
        """Why the guarding ends after a streak, for the one give-up line."""
        return f"{self.failures.count} ticks in a row failed: {self.last_error}"

    def aside(self, what: str, action: Callable[[], object]) -> None:
        """Run ``action`` (what follows a tick: the exporter, a view); its failure is logged, nothing more."""
        try:
            action()
        except Exception as exc:
            log.warning(event("tick_aside_failed", {"run": self.run_id, "what": what, "error": failure_text(exc)}))


@dataclass
class PollPace:
    """The wait before the next tick: ``base_s`` while anything moves (a new line, an intervention state it acts in, a
    failed tick), doubling on each quiet tick up to ``idle_max_s``. A run that logs a step every few seconds is
    then polled a few times per step instead of every ``base_s``, and a new step is still seen within
    ``idle_max_s``."""

    base_s: float
    idle_max_s: float
    _wait_s: float = 0.0

    def next_wait(self, *, busy: bool) -> float:
        if busy or self._wait_s == 0.0:
            self._wait_s = self.base_s
        else:
            self._wait_s = min(self._wait_s * 2, max(self.idle_max_s, self.base_s))
        return self._wait_s
