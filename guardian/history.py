"""A run's timeline of health signals, as the checks see it.

Metric lines define the timeline. A line whose step is below the newest step is a resume (verl re-runs
steps after a rollback or a restart from an older checkpoint): the steps after it belong to an abandoned
branch and leave the active view, and the branch counter goes up. Several lines for one step merge,
later values winning (verl logs validation-before-train on its own line at the resume step, and
fully-async runs log several lines per step). Rollout statistics arrive separately and are merged into
their step without moving the timeline.

Only the signals of ``keys.Signal`` are kept, so memory stays small at 10,000 steps × 300 keys; the
full records go to the store.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from guardian.keys import ALIASES, Signal


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One metric line (or the merge of several) for one training step.

    ``data`` holds numbers only; a non-finite value (verl writes ``null``; other writers ``NaN``)
    is ``math.nan``.
    """

    step: int
    data: Mapping[str, float]


class Arrival(StrEnum):
    """What adding a metric record did to the timeline."""

    NEW_STEP = "new_step"
    MERGED = "merged"
    REWOUND = "rewound"


class Series:
    """One signal's values by step, steps strictly increasing."""

    __slots__ = ("steps", "values")

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.values: list[float] = []

    def __len__(self) -> int:
        return len(self.steps)

    def set(self, step: int, value: float) -> None:
        if not self.steps or step > self.steps[-1]:
            self.steps.append(step)
            self.values.append(value)
            return
        i = bisect_left(self.steps, step)
        if i < len(self.steps) and self.steps[i] == step:
            self.values[i] = value
        else:
            self.steps.insert(i, step)
            self.values.insert(i, value)

    def truncate_after(self, step: int) -> None:
        i = bisect_right(self.steps, step)
        del self.steps[i:]
        del self.values[i:]

    def finite(self, start: int, stop: int) -> list[float]:
        """Finite values at positions [start, stop)."""
        return [v for v in self.values[max(start, 0) : stop] if math.isfinite(v)]

    def last_step(self) -> int | None:
        return self.steps[-1] if self.steps else None


@dataclass
class RunHistory:
    """The active timeline of one run's health signals."""

    series: dict[Signal, Series] = field(default_factory=lambda: {s: Series() for s in Signal})
    last_step: int | None = None
    branch: int = 0
    keys_seen: set[str] = field(default_factory=set)
    # wall-clock arrival of each step's first line (for stall detection); None where unknown
    arrivals: dict[int, float] = field(default_factory=dict)

    def add(self, record: StepRecord, arrived_at: float | None = None) -> Arrival:
        """Add a metric line. Returns what it did to the timeline."""
        step = record.step
        if self.last_step is None or step > self.last_step:
            outcome = Arrival.NEW_STEP
            self.last_step = step
            if arrived_at is not None:
                self.arrivals[step] = arrived_at
        elif step == self.last_step:
            outcome = Arrival.MERGED
        else:
            outcome = Arrival.REWOUND
            self.branch += 1
            for s in self.series.values():
                s.truncate_after(step)
            for later in [k for k in self.arrivals if k > step]:
                del self.arrivals[later]
            self.last_step = step
            if arrived_at is not None:
                self.arrivals[step] = arrived_at
        self._merge_values(step, record.data)
        return outcome

    def merge(self, step: int, data: Mapping[str, float]) -> None:
        """Merge values computed elsewhere (rollout group statistics) into ``step``; no timeline move."""
        self._merge_values(step, data)

    def _merge_values(self, step: int, data: Mapping[str, float]) -> None:
        self.keys_seen.update(data)
        for signal, aliases in ALIASES.items():
            for key in aliases:
                value = data.get(key)
                if value is not None:
                    self.series[signal].set(step, value)
                    break

    def signal(self, signal: Signal) -> Series:
        return self.series[signal]

    def has(self, signal: Signal) -> bool:
        return len(self.series[signal]) > 0

    def present_signals(self) -> list[Signal]:
        return [s for s in Signal if self.has(s)]

    def value_at_or_before(self, signal: Signal, step: int) -> float | None:
        s = self.series[signal]
        i = bisect_right(s.steps, step) - 1
        return s.values[i] if i >= 0 else None


def median(values: Iterable[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return math.nan
    mid = n // 2
    return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])
