"""The one decision policy: what a check's finding means for the run, given how the run's outcome is doing.

The severity a finding ends with is ``TABLE[role][shape][progress]`` (the table is in docs/checks.md): a rollback
needs a failure shape and a run that is not improving; only hard failures act alone. Checks never weigh the reward
themselves. Also here: when a finished log is too little to judge.
Why: docs/decisions/0007-checks-report-shapes-one-policy-decides.md.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import Enum
from types import MappingProxyType
from typing import Final

from guardian.checks.base import ONSET_LOOKBACK
from guardian.checks.trend import Trend, plateau_start, reward_scale, reward_trend_at
from guardian.config import BaselineConfig, PolicyConfig, RewardCollapseConfig
from guardian.core import Finding, Severity
from guardian.history.timeline import RunHistory
from guardian.keys import Signal


class Progress(Enum):
    """How the run's outcome (training reward, and the validation score where logged) is doing now."""

    IMPROVING = "improving"
    HOLDING = "holding near its best"
    SLOWING = "not clearly improving"  # short of its pace, not yet a plateau
    STALLED = "stalled"  # a plateau over twice the reward's window short of its best, or never learned
    FALLING = "falling"
    COLLAPSED = "collapsed"  # below where the run started, or most of its gains lost
    YOUNG = "too young to judge"
    UNMEASURED = "no reward logged"


class Shape(Enum):
    """What a check's raw finding says about its signal."""

    IN_BAND = "in band"
    OUT_OF_BAND = "out of band"
    FAILURE = "failure shape"
    FAST = "fast failure"  # a failure shape reached within a few steps (``evidence["fast"]``)
    HARD = "hard failure"  # unambiguous on its own (``evidence["hard"]``)


class Role(Enum):
    """How a check's finding is weighed against the outcome."""

    MECHANISM = "mechanism"  # entropy, EGR, KL, length, truncation, log-prob: corroborated by the outcome
    ADVISORY = "advisory"  # grad spikes: a warning at most (verl clips the update)
    OUTCOME = "outcome"  # the reward itself: far below its start acts alone, any other fall is a warning
    ALONE = "alone"  # non-finite values, stalls: act without corroboration


W, A, C = Severity.WARN, "advice", Severity.CRITICAL
_PROGRESS = tuple(Progress)


def _row(*cells: Severity | str) -> dict[Progress, Severity | str]:
    return dict(zip(_PROGRESS, cells, strict=True))


# The policy: the severity a finding ends with, by its check's role, its shape and the run's progress.
# "advice" is a WARN that advises (a rescue on probation counts it healthy); IN_BAND is always OK.
#                      improving holding slowing stalled falling collapsed young unmeasured
TABLE: Final = MappingProxyType(
    {
        Role.MECHANISM: {
            Shape.OUT_OF_BAND: _row(A, A, W, W, W, W, W, W),
            Shape.FAILURE: _row(A, A, W, C, C, C, W, C),
            Shape.FAST: _row(A, A, C, C, C, C, W, C),
            Shape.HARD: _row(C, C, C, C, C, C, C, C),
        },
        Role.ADVISORY: {
            Shape.OUT_OF_BAND: _row(A, A, W, W, W, W, W, W),
            Shape.FAILURE: _row(A, A, W, W, W, W, W, W),
            Shape.FAST: _row(A, A, W, W, W, W, W, W),
            Shape.HARD: _row(W, W, W, W, W, W, W, W),
        },
        Role.OUTCOME: {
            Shape.OUT_OF_BAND: _row(W, W, W, W, W, W, W, W),
            Shape.FAILURE: _row(W, W, W, W, W, W, W, W),
            Shape.FAST: _row(W, W, W, W, W, W, W, W),
            Shape.HARD: _row(C, C, C, C, C, C, C, C),
        },
        Role.ALONE: {
            Shape.OUT_OF_BAND: _row(W, W, W, W, W, W, W, W),
            Shape.FAILURE: _row(C, C, C, C, C, C, C, C),
            Shape.FAST: _row(C, C, C, C, C, C, C, C),
            Shape.HARD: _row(C, C, C, C, C, C, C, C),
        },
    }
)

ROLES: Final = MappingProxyType(
    {
        "entropy_collapse": Role.MECHANISM,
        "entropy_explosion": Role.MECHANISM,
        "egr_collapse": Role.MECHANISM,
        "kl_drift": Role.MECHANISM,
        "logprob_decline": Role.MECHANISM,
        "length_collapse": Role.MECHANISM,
        "length_explosion": Role.MECHANISM,
        "truncation": Role.MECHANISM,
        "grad_spike": Role.ADVISORY,
        "reward_collapse": Role.OUTCOME,
        "non_finite": Role.ALONE,
        "stall": Role.ALONE,
    }
)


_SHAPE_ORDER: Final = tuple(Shape)
# the shape the outcome's own reading gives the reward's finding, at least (a sharp fall is seen before the
# trend has points enough for the reward check to judge it)
_OUTCOME_SHAPES: Final = MappingProxyType({Progress.FALLING: Shape.OUT_OF_BAND, Progress.COLLAPSED: Shape.FAILURE})


def shape_of(finding: Finding) -> Shape:
    if finding.severity == Severity.CRITICAL:
        if finding.evidence.get("hard") is True:
            return Shape.HARD
        return Shape.FAST if finding.evidence.get("fast") is True else Shape.FAILURE
    if finding.severity == Severity.WARN:
        return Shape.OUT_OF_BAND
    return Shape.IN_BAND


@dataclass(frozen=True, slots=True)
class ProgressReading:
    progress: Progress
    why: str | Callable[[], str]  # the text, or the function that writes it (most readings are never shown)
    since: int | None = None  # the step a sharp fall began, when the reading rests on one
    hard: bool = False  # far below the run's start for several points: acts alone
    # a stalled run: about where it stopped learning (a window before its plateau); asked only when a slow failure
    # turns critical (walking back to the plateau's start costs a pass over the reward)
    learned_until: Callable[[], int | None] | None = None

    def reason(self) -> str:
        """Why the run reads so, in words."""
        return self.why if isinstance(self.why, str) else self.why()


def decide(finding: Finding, reading: ProgressReading) -> Finding:
    """The finding with the severity the policy gives it; the outcome it was weighed against in its evidence."""
    role = ROLES.get(finding.check)
    shape = shape_of(finding)
    if role is Role.OUTCOME:
        own = Shape.HARD if reading.hard else _OUTCOME_SHAPES.get(reading.progress, Shape.IN_BAND)
        if _SHAPE_ORDER.index(own) > _SHAPE_ORDER.index(shape):
            shape = own
            finding = replace(finding, severity=Severity.WARN, message=reading.reason(), onset_step=reading.since)
    if role is None or shape is Shape.IN_BAND:
        return finding
    cell = TABLE[role][shape][reading.progress]
    severity, advice = (W, True) if cell == A else (cell, False)
    assert isinstance(severity, Severity)
    evidence = {**finding.evidence, "progress": reading.progress.value, "policy": f"{role.value}/{shape.value}"}
    message = finding.message
    if severity < finding.severity:
        message = f"{message} - a warning, not a rollback: {reading.reason()}"
    elif severity == Severity.CRITICAL and role is Role.MECHANISM and shape in (Shape.FAILURE, Shape.FAST):
        message = f"{message}; {reading.reason()}"
    onset = finding.onset_step
    slow_failure_acts = severity == Severity.CRITICAL and shape is Shape.FAILURE
    learned = reading.learned_until() if slow_failure_acts and reading.learned_until is not None else None
    if onset is not None and learned is not None:
        # a slow failure became trouble once the run stopped learning: a rollback keeps the progress made until then
        onset = max(onset, learned)
    return replace(finding, severity=severity, message=message, evidence=evidence, advice=advice, onset_step=onset)


def apply(findings: list[Finding], reading: ProgressReading) -> list[Finding]:
    return [decide(f, reading) for f in findings]


def too_little_to_judge(steps: int, signals: Iterable[str], cfg: PolicyConfig) -> str | None:
    """Why a run read to its end gives the policy too little to judge (a handful of steps, or no reward or
    validation score to weigh a mechanism against), or None. A run so judged is never called healthy."""
    seen = set(signals)
    short = steps < cfg.min_steps_to_judge
    no_outcome = Signal.REWARD.value not in seen and Signal.VAL_SCORE.value not in seen
    if not (short or no_outcome):
        return None
    parts = [f"{steps} steps" + (f" (the checks need {cfg.min_steps_to_judge})" if short else "")]
    if no_outcome:
        parts.append("no reward signal")
    return "not enough data: " + ", ".join(parts)


def read_progress(
    h: RunHistory, cfg: PolicyConfig, reward_cfg: RewardCollapseConfig, bcfg: BaselineConfig
) -> ProgressReading:
    """The outcome at the newest step, with hysteresis both ways: the most lenient reading of the last
    ``outcome_points`` steps (one noisy point does not turn a warning into a rollback), and a plateau is left only
    for a reading that improves or holds, not for one that is merely not clearly improving (a stalled run does not
    flap between the two). A sharp fall (already several points in a row) counts at once."""
    if h.last_step is None or not (h.has(Signal.REWARD) or h.has(Signal.VAL_SCORE)):
        return ProgressReading(Progress.UNMEASURED, "the run logs no reward or validation score")
    n = cfg.outcome_points
    recent = [_reading_at(h, step, cfg, reward_cfg, bcfg) for step in h.steps[-n:]]
    if recent[-1].since is not None:
        return recent[-1]
    held = min(recent, key=lambda r: _SEVERITY_ORDER.index(r.progress))
    if held.progress is Progress.SLOWING:  # read further back only then
        older = h.steps[-_HOLD_LOOKBACK * n : -n] if len(h.steps) > n else []
        for step in reversed(older):
            before = _reading_at(h, step, cfg, reward_cfg, bcfg)
            if before.progress is not Progress.SLOWING:
                return before if before.progress is Progress.STALLED else held
    return held


# how many hysteresis windows back a stall is still held while the reward is only not clearly improving
_HOLD_LOOKBACK: Final = 5


# most lenient first: the order in which a reading excuses a mechanism's failure shape
_SEVERITY_ORDER: Final = (
    Progress.IMPROVING,
    Progress.HOLDING,
    Progress.YOUNG,
    Progress.SLOWING,
    Progress.UNMEASURED,
    Progress.STALLED,
    Progress.FALLING,
    Progress.COLLAPSED,
)


def _reading_at(
    h: RunHistory, step: int, cfg: PolicyConfig, reward_cfg: RewardCollapseConfig, bcfg: BaselineConfig
) -> ProgressReading:
    """The outcome at ``step``: the reward's trend (checks/trend.py), a sharp fall below the run's start (seen
    before the trend has enough points), and the validation score where the run logs one."""
    key = h.key_of(Signal.REWARD)
    trend = reward_trend_at(h, step, reward_cfg, bcfg) if h.has(Signal.REWARD) else None
    below, since = _points_below_start(h, step, cfg)
    val = reward_trend_at(h, step, reward_cfg, bcfg, Signal.VAL_SCORE) if h.has(Signal.VAL_SCORE) else None
    if below >= cfg.sharp_fall_points_hard:
        why = f"{key} fell far below where the run started ({below} points in a row)"
        return ProgressReading(Progress.COLLAPSED, why, since, hard=True)
    if trend is not None and trend.collapsed:
        return ProgressReading(Progress.COLLAPSED, f"{key} fell below its start or gave back most of its gains")
    if below >= cfg.sharp_fall_points or (trend is not None and trend.falling):
        return ProgressReading(Progress.FALLING, f"{key} is falling", since)
    if (trend is not None and trend.improving) or (val is not None and val.improving):
        learning = trend if trend is not None and trend.improving else None

        def still_learning() -> str:
            what = learning.describe(key) if learning is not None else "the validation score improves"
            return f"the run is still learning ({what})"

        return ProgressReading(Progress.IMPROVING, still_learning)
    if trend is None or trend.gain is None:
        return ProgressReading(Progress.YOUNG, f"{key} has too few steps for a trend yet")
    if val is not None and val.falling:
        return ProgressReading(Progress.FALLING, "the validation score is falling")
    if _holding(trend, cfg, reward_cfg):
        held = trend
        return ProgressReading(Progress.HOLDING, lambda: f"{held.describe(key)} holds near its best ({held.peak:.3g})")
    if trend.long_stalled or (trend.stalled and trend.pace == 0):

        def learned_until() -> int | None:
            plateau = plateau_start(h, step, reward_cfg, bcfg)
            return plateau - trend.window if plateau is not None and trend.pace > 0 else None

        stalled = trend
        return ProgressReading(
            Progress.STALLED, lambda: f"{stalled.describe(key)} has stalled", learned_until=learned_until
        )
    slowing = trend
    return ProgressReading(Progress.SLOWING, lambda: f"{slowing.describe(key)} is not clearly improving")


def _holding(t: Trend, cfg: PolicyConfig, reward_cfg: RewardCollapseConfig) -> bool:
    """Near its best. Where the run logs its best sample's score, that is the ceiling: holding means converged
    within ``convergence_margin`` of it (a plateau at half the best sample's score is stalled - a rollback can
    still buy much there). Without one: within noise of a peak the run earned (a gain clear of its noise) or of
    one near the top of its scale. A run that never learned, far from the top, is stalled, not holding."""
    if t.ceiling is not None:
        return t.converged
    near_peak = t.peak - t.level <= max(t.z * t.level_sigma, cfg.holding_margin * t.scale)
    learned = t.peak - t.baseline > t.z * t.level_sigma
    near_top = t.level >= (1 - reward_cfg.convergence_margin) * t.scale
    return near_peak and (learned or near_top)


def _points_below_start(h: RunHistory, step: int, cfg: PolicyConfig) -> tuple[int, int | None]:
    """How many of the newest reward points, in a row, lie below the run's start by ``sharp_drop`` of the
    reward's scale (a fall no noise explains, read before the trend has points enough to judge), and the
    step the first of them was logged at. Walks back from ``step`` at most ``ONSET_LOOKBACK`` points."""
    series = h.signal(Signal.REWARD)
    scale = reward_scale(h, step)
    start, first_after = _start_level(series.values, cfg.start_points)
    if start is None or scale is None:
        return 0, None
    bar = start - cfg.sharp_drop * scale
    count, since = 0, None
    i = bisect_right(series.steps, step) - 1
    floor = max(first_after, i - ONSET_LOOKBACK)
    while i >= floor:
        value = series.values[i]
        if math.isfinite(value):
            if not value < bar:
                break
            count, since = count + 1, series.steps[i]
        i -= 1
    return count, since


def _start_level(values: list[float], points: int) -> tuple[float | None, int]:
    """The median of the first ``points`` finite values and the position after the last of them (None while
    the series holds fewer)."""
    first: list[float] = []
    for i, value in enumerate(values):
        if math.isfinite(value):
            first.append(value)
            if len(first) == points:
                return statistics.median(first), i + 1
    return None, len(values)
