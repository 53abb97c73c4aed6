"""The report's signals over steps, from the store's step lines. Pure.

A signal is read as the checks read it (``keys.ALIASES``). Each plot has the kept timeline and one trace per
abandoned line, starting at its last kept step."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from guardian.keys import ALIASES, VAL_CORE_PREFIX, VAL_MEAN_MARKER, Signal, is_val_score_key
from guardian.store.views import StepLine

Point = tuple[int, float | None]  # (step, value); None: logged non-finite (NaN/inf)
StepRange = tuple[int, int]  # first and last step, both included

# what the report plots, in its order, with the title people read
PLOTTED: tuple[tuple[Signal, str], ...] = (
    (Signal.ENTROPY, "Entropy"),
    (Signal.EGR, "Effective group ratio (EGR)"),
    (Signal.KL, "KL to the reference"),
    (Signal.LOG_PPL, "Mean −log π per token (log_ppl)"),
    (Signal.REWARD, "Reward (mean score)"),
    (Signal.VAL_SCORE, "Validation score"),
    (Signal.LENGTH_MEAN, "Response length (mean tokens)"),
)
VAL_SCORE_KEYS = f"{VAL_CORE_PREFIX}*{VAL_MEAN_MARKER}*"
# what ``Store.step_lines`` must hand over for them: every alias, and the validation keys by their prefix
READ_KEYS: frozenset[str] = frozenset(key for signal, _ in PLOTTED for key in ALIASES[signal])
READ_PREFIXES: tuple[str, ...] = (VAL_CORE_PREFIX,)


class MarkerKind(StrEnum):
    """The moments of an incident the plots mark with a vertical line."""

    ONSET = "onset"
    DETECTION = "detection"
    ROLLBACK = "rollback"
    RESUME = "resume"


@dataclass(frozen=True, slots=True)
class Marker:
    step: int
    kind: MarkerKind
    label: str


@dataclass(frozen=True, slots=True)
class Trace:
    """One drawn line of a signal: the kept timeline, or what one line of steps logged after it was abandoned."""

    name: str
    abandoned: bool
    points: tuple[Point, ...]  # steps ascending


@dataclass(frozen=True, slots=True)
class Plot:
    """One signal over the report's steps."""

    signal: Signal
    title: str
    key: str | None  # the metric key it was read from; None: no step in range logs it
    traces: tuple[Trace, ...]

    @property
    def finite(self) -> bool:
        """Some value can be drawn (a signal logged only as NaN/inf cannot)."""
        return any(v is not None for t in self.traces for _, v in t.points)


def reading(signal: Signal, values: Mapping[str, float | None]) -> tuple[str, float | None] | None:
    """The key a step logs ``signal`` under and its value (None: non-finite); None when the step does not log it."""
    if signal is Signal.VAL_SCORE:
        scores = [v for k, v in values.items() if is_val_score_key(k)]
        if not scores:
            return None
        finite = [v for v in scores if v is not None and math.isfinite(v)]
        return VAL_SCORE_KEYS, (sum(finite) / len(finite) if finite else None)
    for key in ALIASES[signal]:
        if key in values:
            value = values[key]
            return key, value if value is not None and math.isfinite(value) else None
    return None


def step_range(lines: Sequence[StepLine]) -> StepRange | None:
    """The first and last step any line logged; None when none did."""
    steps = [step for line in lines for step, _ in line.steps]
    return (min(steps), max(steps)) if steps else None


def kept_attempts(lines: Sequence[StepLine]) -> dict[int, int]:
    """Step -> the number of the attempt whose line holds it on the kept timeline."""
    return {step: line.attempt_number for line in lines for step, _ in line.steps if line.kept(step)}


def _line_name(line: StepLine) -> str:
    return f"attempt {line.attempt_number}" + (f" branch {line.branch}" if line.branch else "") + " (abandoned)"


def plot(signal: Signal, title: str, lines: Sequence[StepLine], steps: StepRange) -> Plot:
    """``signal`` over ``steps``: the kept timeline, then each abandoned stretch."""
    lo, hi = steps
    key: str | None = None
    kept: list[Point] = []
    abandoned: list[Trace] = []
    for line in lines:
        branch: list[Point] = []
        last_kept: Point | None = None
        for step, values in line.steps:
            found = reading(signal, values)
            if found is None or not lo <= step <= hi:
                continue
            key = key or found[0]
            if line.kept(step):
                kept.append((step, found[1]))
                last_kept = (step, found[1])
            else:
                branch.append((step, found[1]))
        if branch:
            start = (last_kept,) if last_kept is not None else ()
            abandoned.append(Trace(_line_name(line), True, (*start, *branch)))
    traces = (Trace("kept timeline", False, tuple(sorted(kept, key=lambda point: point[0]))), *abandoned)
    return Plot(signal, title, key, tuple(t for t in traces if t.points))


def plots(lines: Sequence[StepLine], steps: StepRange | None) -> tuple[Plot, ...]:
    """Every plotted signal; one no step logs has no key and no traces (the page says "not logged")."""
    return tuple(
        plot(signal, title, lines, steps) if steps is not None else Plot(signal, title, None, ())
        for signal, title in PLOTTED
    )
