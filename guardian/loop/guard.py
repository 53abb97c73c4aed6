"""The one guard loop: ``guardian run``, ``guardian watch`` and ``guardian demo`` each hand it what they tick.

Each pass: the guarded tick (``ticks.GuardedTick``: a tick that raises is logged and the loop goes on), then
``record_poll(ok, seconds, moved)`` - the exporter's poll status, the tick's duration and whether it saw something
move, which publishes the tick's one ``RunSnapshot`` - then, once ``failure_limit`` ticks in a row failed (a streak
of outages only: once they failed for ``outage_limit_s``), the ticked object's ``cannot_continue``, then
``show(ok)`` - the views, drawn from that same snapshot. Both hooks are side shows: their failure is logged and
never fails a tick. The loop ends with the tick's code (the run is over, or it gave up) or, when ``wait`` says the
guardian was told to stop, with None. The wait is injected, so tests drive the loop through time without
sleeping; ``pace`` says how long each wait is.
"""

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
