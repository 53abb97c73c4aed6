"""Doubling back-off: the wait before a retry (the store's replay, an alert's redelivery, a quiet poll).
``doubling`` is the pure rule (``first_s``, doubled, capped at ``max_s``); ``Backoff`` counts attempts for a
caller that keeps state. Nothing here sleeps or reads a clock."""

from __future__ import annotations

from dataclasses import dataclass


def doubling(attempt: int, first_s: float, max_s: float) -> float:
    """Seconds before retry number ``attempt`` (1-based; 0 or less counts as 1): first_s * 2**(attempt-1), capped."""
    delay = min(first_s, max_s)
    if first_s <= 0:
        return delay
    for _ in range(max(attempt, 1) - 1):  # at most log2(max_s / first_s) + 1 rounds: no overflow
        delay *= 2
        if delay >= max_s:
            return max_s
    return delay


@dataclass
class Backoff:
    """The attempts of one retry loop: ``next_delay`` gives the next wait, ``reset`` starts over at ``first_s``."""

    first_s: float
    max_s: float
    attempts: int = 0

    def next_delay(self) -> float:
        self.attempts += 1
        return doubling(self.attempts, self.first_s, self.max_s)

    def reset(self) -> None:
        self.attempts = 0
