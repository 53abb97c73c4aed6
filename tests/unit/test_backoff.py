"""The one doubling back-off: its rule, its state, and the numbers each caller had before it."""

from __future__ import annotations

import pytest

from guardian.backoff import Backoff, doubling
from guardian.loop.pace import PollPace
from guardian.notify.dispatcher import MAX_BACKOFF_S, backoff_s
from guardian.store.writebehind import RETRY_FIRST_S, RETRY_MAX_S


def test_doubling_starts_at_first_and_stops_at_the_cap() -> None:
    assert [doubling(n, 1.0, 60.0) for n in range(0, 9)] == [1, 1, 2, 4, 8, 16, 32, 60, 60]
    assert doubling(10**6, 1.0, 60.0) == 60.0, "no overflow on a huge attempt count"
    assert doubling(3, 5.0, 2.0) == 2.0, "a first wait above the cap is the cap"
    assert doubling(7, 0.0, 5.0) == 0.0, "no wait stays no wait"


def test_backoff_counts_attempts_and_resets() -> None:
    backoff = Backoff(0.5, 3.0)
    assert [backoff.next_delay() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    backoff.reset()
    assert backoff.next_delay() == 0.5


@pytest.mark.parametrize("attempts", range(0, 12))
def test_the_dispatchers_numbers_are_unchanged(attempts: int) -> None:
    assert backoff_s(attempts) == min(MAX_BACKOFF_S, 2.0 ** max(attempts - 1, 0))


def test_the_stores_replay_waits_are_unchanged() -> None:
    old, delay = [], RETRY_FIRST_S
    for _ in range(10):
        old.append(delay)
        delay = min(delay * 2, RETRY_MAX_S)
    backoff = Backoff(RETRY_FIRST_S, RETRY_MAX_S)
    assert [backoff.next_delay() for _ in range(10)] == old


@pytest.mark.parametrize(("base_s", "idle_max_s"), [(0.5, 4.0), (2.0, 1.0), (0.0, 0.0)])
def test_the_poll_pace_is_unchanged(base_s: float, idle_max_s: float) -> None:
    ticks = [(True, True), (True, False), (True, False), (True, False), (True, False), (False, False), (True, False)]
    pace, wait, expected = PollPace(base_s, idle_max_s), 0.0, []
    for ok, busy in ticks:
        wait = base_s if busy or not ok or wait == 0.0 else min(wait * 2, max(idle_max_s, base_s))
        expected.append(wait)
    assert [pace.next_wait(ok=ok, busy=busy) for ok, busy in ticks] == expected
