"""The one guard loop: ``guardian run``, ``guardian watch`` and ``guardian demo`` each hand it what they tick.

Each pass: the guarded tick, ``record_poll`` (publishes the tick's snapshot), ``cannot_continue`` once failures
reach the limit, then ``show``. The hooks are side shows: their failure never fails a tick. Ends with the tick's
code, or None when told to stop. The wait is injected (``pace``), so tests run without sleeping."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Protocol, TypeVar

from guardian.loop.outage import TickFailures
from guardian.loop.pace import Pace
from guardian.loop.ticks import GuardedTick, aside

Code = TypeVar("Code", covariant=True)
# how every give-up line begins: the loop logged the fault (event=tick_failed), the caller says how to resume
FIX = "the traceback of event=tick_failed names the fault; fix it, then "


class Ticking(Protocol[Code]):
    """What the loop ticks: ``rescue.supervisor.Supervisor`` (exit codes), ``commands.watch.loop.WatchLoop``
    (end reasons)."""

    @property
    def run_id(self) -> str: ...

    @property
    def busy(self) -> bool:
        """Whether the last tick saw something move (the pace's ``busy``)."""
        ...

    def tick(self) -> Code | None:
        """One pass; its code ends the loop, None goes on."""
        ...

    def cannot_continue(self, *, cause: str, fix: str) -> Code:
        """The tick-failure streak is exhausted: say so in one line (and what became of the trainer)."""
        ...


def _nothing(ok: bool) -> None:
    return None


def _no_poll(ok: bool, seconds: float, moved: bool) -> None:
    return None


def guard(
    ticking: Ticking[Code],
    *,
    pace: Pace,
    wait: Callable[[float], bool],
    failure_limit: int,
    outage_limit_s: float,
    resume: str,
    record_poll: Callable[[bool, float, bool], None] = _no_poll,
    show: Callable[[bool], None] = _nothing,
    passthrough: tuple[type[Exception], ...] = (),
) -> Code | None:
    """Tick until a tick's code (returned) or a stop (``wait`` returned True: None). ``resume`` ends the give-up
    line's fix (how to guard the run again); ``passthrough`` exceptions of a tick end the loop (raised)."""
    guarded = GuardedTick(ticking.run_id, TickFailures(limit=failure_limit, outage_limit_s=outage_limit_s))
    while True:
        ok, code = guarded(ticking.tick, passthrough=passthrough)
        aside(ticking.run_id, "exporter", partial(record_poll, ok, guarded.last_seconds, ticking.busy))
        if guarded.exhausted:
            code = ticking.cannot_continue(cause=guarded.cause(), fix=FIX + resume)
        aside(ticking.run_id, "view", partial(show, ok))
        if code is not None:
            return code
        if wait(pace.next_wait(ok=ok, busy=ticking.busy)):
            return None
