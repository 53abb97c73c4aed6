"""A run's timeline of health signals, as the checks see it.

A line whose step is below the newest is a resume: later steps move to an abandoned branch (the latest one is
kept for comparison) and the branch counter goes up. Lines of one step merge, later values winning; rollout
statistics merge into their step. Only ``keys.Signal`` values are kept; full records go to the store."""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from guardian.core import StepRecord
from guardian.keys import (
    ALIASES,
    EGR_KEY,
    NON_FINITE_WATCHED_KEYS,
    VAL_CORE_PREFIX,
    VAL_MEAN_MARKER,
    Signal,
    resolve,
)

# signals whose values the reward's derived judgments read (checks/trend.py: ceiling and scale)
SCORE_RANGE_SIGNALS = frozenset({Signal.REWARD_MAX, Signal.REWARD_MIN})
# the signals a verl key can carry, with their keys in priority order (signals without keys left out)
_ALIAS_ITEMS = tuple((signal, aliases) for signal, aliases in ALIASES.items() if aliases)


class Arrival(StrEnum):
    """What adding a metric record did to the timeline."""

    NEW_STEP = "new_step"
    MERGED = "merged"
    REWOUND = "rewound"


class Series:
    """One signal's values by step, steps strictly increasing."""

    __slots__ = ("_baselines", "_derived", "_peaks", "_smoothed", "steps", "values")

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.values: list[float] = []
        # window -> rolling median of finite values ending at each position (extended lazily)
        self._smoothed: dict[int, list[float]] = {}
        # window -> running maximum of the smoothed values (extended lazily)
        self._peaks: dict[int, list[float]] = {}
        # (start, count) -> median of the first ``count`` finite values from ``start``, once known
        self._baselines: dict[tuple[int, int], float] = {}
        # key -> per-position values a check derives from this series alone (extended lazily, see ``derived``)
        self._derived: dict[object, list[Any]] = {}

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
        self._forget_smoothed_from(i)

    def tail_after(self, step: int) -> Series:
        """A new series of the values after ``step``."""
        tail = Series()
        i = bisect_right(self.steps, step)
        tail.steps, tail.values = self.steps[i:], self.values[i:]
        return tail

    def truncate_after(self, step: int) -> None:
        i = bisect_right(self.steps, step)
        del self.steps[i:]
        del self.values[i:]
        self._forget_smoothed_from(i)

    def forget_from_step(self, step: int) -> None:
        """Forget what was derived at ``step`` and later (something it depends on changed there)."""
        position = bisect_left(self.steps, step)
        if any(len(cached) > position for cached in self._derived.values()):  # the newest step: nothing yet
            self._forget_smoothed_from(position)

    def _forget_smoothed_from(self, position: int) -> None:
        for table in (self._smoothed, self._peaks, self._derived):
            for cached in table.values():
                del cached[position:]
        for key in [k for k in self._baselines if position < k[0] + k[1]]:
            del self._baselines[key]

    def smoothed(self, window: int) -> list[float]:
        """Rolling median (finite values only, NaN where none) over ``window`` points, per position."""
        cached = self._smoothed.setdefault(window, [])
        if len(cached) == len(self.values):  # asked again within a tick: nothing new
            return cached
        for i in range(len(cached), len(self.values)):
            cached.append(median(self.finite(i - window + 1, i + 1)))
        return cached

    def derived(self, key: object, compute: Callable[[int, list[Any]], Any]) -> list[Any]:
        """Per-position values ``compute(position, earlier)`` derived from this series' values up to that
        position (``earlier`` holds the values already derived), cached like ``smoothed``: a rewind or a
        changed value forgets them from that position on. ``key`` names the derivation and its settings."""
        cached = self._derived.setdefault(key, [])
        if len(cached) == len(self.values):
            return cached
        for i in range(len(cached), len(self.values)):
            cached.append(compute(i, cached))
        return cached

    def peak(self, window: int) -> list[float]:
        """Running maximum of ``smoothed(window)`` per position (NaN until a finite value)."""
        smooth = self.smoothed(window)
        cached = self._peaks.setdefault(window, [])
        best = cached[-1] if cached else math.nan
        for i in range(len(cached), len(smooth)):
            value = smooth[i]
            if math.isfinite(value) and not value <= best:
                best = value
            cached.append(best)
        return cached

    def baseline(self, start: int, count: int) -> float | None:
        """Median of the first ``count`` finite values at positions [start, start + count); None until
        that window is full. Cached once known (it cannot change unless the series is rewound into it)."""
        key = (start, count)
        known = self._baselines.get(key)
        if known is not None:
            return known
        values = self.finite(start, start + count)
        if len(values) < count:
            return None
        self._baselines[key] = result = median(values)
        return result

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
    # the metric steps of the active timeline, increasing
    steps: list[int] = field(default_factory=list)
    branch: int = 0
    keys_seen: set[str] = field(default_factory=set)
    # wall-clock arrival of each step's first line (for stall detection)
    arrivals: dict[int, float] = field(default_factory=dict)
    # data.max_response_length when known; else the longest response seen stands in for it
    length_cap: float | None = None
    # data.train_batch_size when known: lets EGR be estimated from DAPO eviction counts
    train_batch_size: int | None = None
    _longest_seen: float = 0.0
    # steps whose watched keys (keys.NON_FINITE_WATCHED_KEYS) were NaN/inf/null, and which keys
    non_finite: dict[int, frozenset[str]] = field(default_factory=dict)
    # the key that last carried each signal (findings name it: "actor/entropy fell ...")
    source_keys: dict[Signal, str] = field(default_factory=dict)
    # the steps the latest rewind abandoned, per signal (what a rescue's new branch is compared with)
    abandoned: dict[Signal, Series] = field(default_factory=dict)

    def add(self, record: StepRecord, arrived_at: float | None = None) -> Arrival:
        """Add a metric line. Returns what it did to the timeline."""
        step = record.step
        if self.last_step is None or step > self.last_step:
            outcome = Arrival.NEW_STEP
            self.last_step = step
            self.steps.append(step)
            if arrived_at is not None:
                self.arrivals[step] = arrived_at
        elif step == self.last_step:
            outcome = Arrival.MERGED
        else:
            outcome = Arrival.REWOUND
            self.branch += 1
            self.abandoned = {signal: s.tail_after(step - 1) for signal, s in self.series.items()}
            for s in self.series.values():
                s.truncate_after(step)
            del self.steps[bisect_right(self.steps, step) :]
            if not self.steps or self.steps[-1] != step:
                self.steps.append(step)
            for table in (self.arrivals, self.non_finite):
                for later in [k for k in table if k > step]:
                    del table[later]
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
        self._derive(step, data)
        broken = frozenset(k for k in NON_FINITE_WATCHED_KEYS if k in data and not math.isfinite(data[k]))
        if broken:
            self.non_finite[step] = self.non_finite.get(step, frozenset()) | broken
        series, source_keys = self.series, self.source_keys
        for signal, aliases in _ALIAS_ITEMS:
            for key in aliases:
                value = data.get(key)
                if value is not None:
                    series[signal].set(step, value)
                    source_keys[signal] = key
                    if signal in SCORE_RANGE_SIGNALS:
                        # the reward's trend is judged against the best and worst sample scores so far
                        series[Signal.REWARD].forget_from_step(step)
                    break

    def _derive(self, step: int, data: Mapping[str, float]) -> None:
        """Signals verl does not log but that follow from what it does log."""
        clip = resolve(Signal.LENGTH_CLIP_RATIO, data)
        longest = resolve(Signal.LENGTH_MAX, data)
        if clip is not None and longest is not None and resolve(Signal.TRUNCATION, data) is None:
            self.series[Signal.TRUNCATION].set(step, derive_truncation(clip[1], longest[1], self._cap(longest[1])))
        turns = resolve(Signal.NUM_TURNS, data)
        if turns is not None and resolve(Signal.TOOL_CALLS, data) is None:
            self.series[Signal.TOOL_CALLS].set(step, tool_calls_from_turns(turns[1]))
        # is_val_score_key, inlined: a call per key of every line adds up
        val = [
            v for k, v in data.items() if k.startswith(VAL_CORE_PREFIX) and VAL_MEAN_MARKER in k and math.isfinite(v)
        ]
        if val:
            self.series[Signal.VAL_SCORE].set(step, sum(val) / len(val))
        evicted = resolve(Signal.FILTER_EVICTED, data)
        # an EGR measured from rollout dumps always wins over the estimate
        if evicted is not None and self.train_batch_size and EGR_KEY not in self.keys_seen:
            self.series[Signal.EGR].set(step, estimate_egr(evicted[1], self.train_batch_size))

    def _cap(self, longest: float) -> float:
        if self.length_cap is not None:
            return self.length_cap
        if math.isfinite(longest):
            self._longest_seen = max(self._longest_seen, longest)
        return self._longest_seen

    def signal(self, signal: Signal) -> Series:
        return self.series[signal]

    def key_of(self, signal: Signal) -> str:
        """The verl key the signal was read from (or the signal's own name when it is derived)."""
        key = self.source_keys.get(signal)
        return signal.value if key is None else key

    def has(self, signal: Signal) -> bool:
        return len(self.series[signal]) > 0

    def value_at_or_before(self, signal: Signal, step: int) -> float | None:
        s = self.series[signal]
        i = bisect_right(s.steps, step) - 1
        return s.values[i] if i >= 0 else None


def derive_truncation(clip_ratio: float, longest: float, cap: float) -> float:
    """Share of responses cut at the length cap.

    verl V0 pads responses to ``max_response_length``, so ``response_length/clip_ratio`` is the
    truncated share; V1 pads to the batch max, so it is the share *at the batch max* (facts gotcha 7).
    Both read right when the batch max reached the cap, and no response was cut when it did not.
    """
    if not math.isfinite(clip_ratio):
        return math.nan
    return clip_ratio if math.isfinite(longest) and cap > 0 and longest >= cap else 0.0


def tool_calls_from_turns(mean_turns: float) -> float:
    """Tool calls per trajectory from verl's ``num_turns/mean``: a tool-agent trajectory has
    ``2 + 2 * calls`` turns (prompt and final answer, then one assistant and one tool turn per call)
    with ``max_parallel_calls=1`` (facts §1.3); 0 for a single-turn agent."""
    if not math.isfinite(mean_turns):
        return math.nan
    return max(0.0, (mean_turns - 2.0) / 2.0)


def estimate_egr(evicted_groups: float, train_batch_size: int) -> float:
    """EGR before DAPO filtering: kept / (kept + evicted) groups (facts §1.8; ignores surplus)."""
    if not math.isfinite(evicted_groups):
        return math.nan
    return train_batch_size / (train_batch_size + max(evicted_groups, 0.0))


def median(values: Iterable[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return math.nan
    mid = n // 2
    return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])
