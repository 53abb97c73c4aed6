"""One tick of the guard loop, guarded: a tick that raises is logged once per streak (``event=tick_failed``,
outage or bug per ``guardian.faults``) and the loop goes on; ``event=tick_recovered`` ends the streak.
What follows a tick (``aside``) is a side show: its failure is logged, never counted, never loses the result."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from guardian.faults import failure_text, fault_fields, is_outage
from guardian.logs import event, get_logger
from guardian.loop.outage import TickFailures

log = get_logger("ticks")
T = TypeVar("T")


@dataclass
class GuardedTick:
    run_id: str
    failures: TickFailures
    last_error: str = ""
    timer: Callable[[], float] = field(default=time.perf_counter, repr=False)
    last_seconds: float = 0.0  # how long the last tick took, raised or not (guardian_tick_duration_seconds)

    def __call__(
        self, tick: Callable[[], T], *, passthrough: tuple[type[Exception], ...] = ()
    ) -> tuple[bool, T | None]:
        """Run ``tick``: (True, its result), or (False, None) when it raised (``passthrough`` exceptions are
        re-raised: they end the loop on purpose)."""
        started = self.timer()
        try:
            result = tick()
        except passthrough:
            raise
        except Exception as exc:
            self.last_seconds = self.timer() - started
            self.last_error = failure_text(exc)
            outage = is_outage(exc)
            if self.failures.failed(outage=outage, now=self.timer()):
                kind = "outage" if outage else "bug"
                fields = {"run": self.run_id, "kind": kind, **fault_fields(exc), "next": "retrying every tick"}
                log.error(event("tick_failed", fields), exc_info=True)
            return False, None
        self.last_seconds = self.timer() - started
        if self.failures.count:
            log.warning(event("tick_recovered", {"run": self.run_id, "failed_ticks": self.failures.succeeded()}))
        return True, result

    @property
    def exhausted(self) -> bool:
        return self.failures.exhausted

    def cause(self) -> str:
        """Why the guarding ends after a streak, for the one give-up line."""
        failures = self.failures
        lasting = f" over {failures.last - failures.since:.0f} s" if failures.outages_only else ""
        return f"{failures.count} ticks in a row failed{lasting}: {self.last_error}"


def aside(run_id: str, what: str, action: Callable[[], object]) -> None:
    """Run ``action`` (what follows a tick: the exporter, a view); its failure is logged, nothing more."""
    try:
        action()
    except Exception as exc:
        log.warning(event("tick_aside_failed", {"run": run_id, "what": what, **fault_fields(exc)}))
