"""What every check shares: the context it reads, baselines, hysteresis and onset estimation.

A check is a pure function ``CheckContext -> Finding``. Most judge one signal by a level function
``level_at(position) -> Severity``; ``judge`` applies the hysteresis (a level is entered, and left, only after
``for_steps`` points in a row) and walks back to estimate where the trouble began.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from guardian.checks.signs import LifeSigns
from guardian.config import BaselineConfig
from guardian.core import EvidenceValue, Finding, Severity, StepSchedule
from guardian.history.timeline import RunHistory, Series
from guardian.keys import Signal

# How far back (in points) an onset estimate may walk; bounds the cost of a long-running condition.
ONSET_LOOKBACK = 500
# How many hysteresis windows back ``judge`` replays when the latest points disagree.
HOLD_LOOKBACK = 4


@dataclass(frozen=True, slots=True)
class CheckContext:
    """Everything a check may read. ``now``/``started_at`` are wall-clock seconds; None in replay.
    ``trainer_alive``: whether the trainer process is still running; None when no process is known (``watch``
    without ``--pid``, replay). ``schedule``, ``life_signs`` and ``first_startup_s`` are the stall check's: the
    steps verl saves and validates at, what the disk showed of the step in progress, and how long the first launch
    took to its first step (None: not known)."""

    history: RunHistory
    baseline: BaselineConfig
    now: float | None = None
    started_at: float | None = None
    trainer_alive: bool | None = None
    schedule: StepSchedule | None = None
    life_signs: LifeSigns | None = None
    first_startup_s: float | None = None


@dataclass(frozen=True, slots=True)
class Check:
    """A named, configured check."""

    name: str
    evaluate: Callable[[CheckContext], Finding]


def baseline(series: Series, cfg: BaselineConfig) -> float | None:
    """Median of the first ``cfg.steps`` finite values after ``cfg.warmup_steps`` points; None until known."""
    return series.baseline(cfg.warmup_steps, cfg.steps)


def baseline_end(cfg: BaselineConfig) -> int:
    """First position judged against the baseline (positions before it form the baseline)."""
    return cfg.warmup_steps + cfg.steps


def unknown(check: str, step: int | None, why: str) -> Finding:
    return Finding(check=check, severity=Severity.UNKNOWN, step=step, message=why)


def waiting(check: str, step: int | None) -> Finding:
    return unknown(check, step, "baseline not established yet")


def ok(check: str, step: int | None, message: str, evidence: dict[str, EvidenceValue]) -> Finding:
    return Finding(check=check, severity=Severity.OK, step=step, message=message, evidence=evidence)


@dataclass(frozen=True, slots=True)
class Verdict:
    severity: Severity
    onset_step: int | None


def judge(
    series: Series,
    level_at: Callable[[int], Severity],
    *,
    for_steps: int,
    first_position: int,
    departed_at: Callable[[int], bool] | None = None,
) -> Verdict:
    """Hysteresis both ways, then the onset by walking back.

    A level is entered when ``for_steps`` points in a row reach it and left only when ``for_steps`` points
    in a row fall below it, so one noisy point neither raises a critical nor eases one (no flapping
    critical/warn/critical). The onset is the earliest point of the unbroken run (ending now) in which the
    signal had ``departed`` from normal; by default "departed" means a level of WARN or worse.
    """
    last = len(series) - 1
    if last < first_position:
        return Verdict(Severity.UNKNOWN, None)
    if last - first_position + 1 < for_steps:
        return Verdict(Severity.OK, None)
    severity = _settled(level_at, for_steps, first_position, last)
    if severity < Severity.WARN:
        return Verdict(severity, None)
    departed = departed_at or (lambda i: level_at(i) >= Severity.WARN)
    onset = last
    floor = max(first_position, last - ONSET_LOOKBACK)
    while onset - 1 >= floor and departed(onset - 1):
        onset -= 1
    return Verdict(severity, series.steps[onset])


def _settled(level_at: Callable[[int], Severity], for_steps: int, first_position: int, last: int) -> Severity:
    """The level the hysteresis holds at ``last``. The common case - the last ``for_steps`` points agree -
    costs ``for_steps`` evaluations; otherwise the automaton replays the last ``HOLD_LOOKBACK`` windows."""
    window = [level_at(i) for i in range(last - for_steps + 1, last + 1)]
    if min(window) == max(window):
        return window[0]
    start = max(first_position, last - HOLD_LOOKBACK * for_steps + 1)
    levels = [level_at(i) for i in range(start, last - for_steps + 1)] + window
    state = min(levels[:for_steps])
    for end in range(for_steps, len(levels)):
        recent = levels[end - for_steps + 1 : end + 1]
        if min(recent) > state:
            state = min(recent)  # every point of the window reached a higher level
        elif max(recent) < state:
            state = max(recent)  # every point of the window fell below the held level
    return state


def conclude(
    check: str,
    step: int | None,
    verdict: Verdict,
    evidence: dict[str, EvidenceValue],
    *,
    healthy: str,
    unhealthy: str | Callable[[], str],
    advice: bool = False,
) -> Finding:
    """The finding for a verdict: ``unhealthy`` text for WARN/CRITICAL (or the function that writes it, called
    only then), ``healthy`` for OK; ``advice`` marks a WARN that advises rather than reports trouble."""
    if verdict.severity >= Severity.WARN:
        is_advice = advice and verdict.severity == Severity.WARN
        text = unhealthy if isinstance(unhealthy, str) else unhealthy()
        return Finding(check, verdict.severity, step, text, verdict.onset_step, evidence, is_advice)
    if verdict.severity == Severity.UNKNOWN:
        return Finding(check, Severity.UNKNOWN, step, "not enough steps to judge yet", None, evidence)
    return ok(check, step, healthy, evidence)


def ratio(value: float, reference: float) -> float:
    if not math.isfinite(value) or not math.isfinite(reference) or reference == 0:
        return math.nan
    return value / reference


def rounded(value: float | None) -> float | None:
    """An evidence value: finite floats as they are, non-finite as None (rounded when shown)."""
    if value is None or not math.isfinite(value):
        return None
    return value


def need(history: RunHistory, check: str, *signals: Signal) -> Finding | None:
    """An UNKNOWN finding naming the first missing signal, or None when all are present."""
    for s in signals:
        if not history.has(s):
            return unknown(check, history.last_step, f"signal '{s.value}' not logged by this run")
    return None


def ratio_to_baseline(series: Series, cfg: BaselineConfig, floor: float = 0.0) -> Callable[[int], float] | None:
    """``position -> smoothed value / max(baseline, floor)``; None until the baseline is known."""
    base = baseline(series, cfg)
    if base is None:
        return None
    reference = max(base, floor)
    smooth = series.smoothed(cfg.smooth_steps)
    return lambda i: ratio(smooth[i], reference)


def signal_ratio(
    ctx: CheckContext, check: str, signal: Signal, floor: float = 0.0
) -> tuple[Series, Callable[[int], float]] | Finding:
    """The signal's series and its ratio-to-baseline function, or the UNKNOWN finding that says why not
    (the run does not log the signal, or its baseline is not established yet)."""
    if (missing := need(ctx.history, check, signal)) is not None:
        return missing
    series = ctx.history.signal(signal)
    ratio_of = ratio_to_baseline(series, ctx.baseline, floor)
    if ratio_of is None:
        return waiting(check, ctx.history.last_step)
    return series, ratio_of


def signal_baseline(ctx: CheckContext, check: str, signal: Signal) -> tuple[Series, float] | Finding:
    """The signal's series and its (positive) baseline, or the UNKNOWN finding that says why not."""
    if (missing := need(ctx.history, check, signal)) is not None:
        return missing
    series = ctx.history.signal(signal)
    base = baseline(series, ctx.baseline)
    if base is None or base <= 0:
        return waiting(check, ctx.history.last_step)
    return series, base
