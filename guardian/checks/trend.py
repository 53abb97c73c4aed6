"""The reward's trend, judged against the run's own noise and pace: improving, stalled, falling, collapsed,
saturated, converged.

No judgment is a fixed share of the score range or a fixed number of steps: noise, level, pace and the judging
window are the run's own. The same functions judge the validation score and a rescue's outcome. Pure; per-position
facts are cached on the series. Definitions and why: docs/decisions/0008-reward-trend-against-its-own-noise.md.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

from guardian.checks.base import ONSET_LOOKBACK, baseline
from guardian.config import BaselineConfig, RewardCollapseConfig
from guardian.history.timeline import RunHistory, Series
from guardian.keys import Signal

# robust sigma of one value from the median absolute deviation of first differences: MAD * 1.4826 is the
# sigma of a difference of two values, which is sqrt(2) times the sigma of one
_MAD_TO_SIGMA = 1.4826 / math.sqrt(2.0)
MIN_NOISE_POINTS = 5
# a median's variance is about pi/2 times a mean's
_MEDIAN_VARIANCE = math.pi / 2


@dataclass(frozen=True, slots=True)
class _Point:
    """What the trend needs at one position of the reward series; depends on values up to it only."""

    level: float  # mean of the last level_steps finite values (NaN before the first)
    count: int  # finite values up to here
    noise: float  # sigma of one value (NaN until MIN_NOISE_POINTS differences)
    peak: float  # best level since the baseline window (NaN before)
    peak_step: int | None


def _points(series: Series, cfg: RewardCollapseConfig, bcfg: BaselineConfig) -> list[_Point]:
    k, n_noise = cfg.level_steps, cfg.noise_steps
    start = bcfg.warmup_steps + bcfg.steps  # positions before it form the baseline: no peak there

    def compute(i: int, earlier: list[_Point]) -> _Point:
        recent = _finite_back(series.values, i, max(n_noise + 1, k))
        before = earlier[-1] if earlier else None
        count = (before.count if before else 0) + (1 if math.isfinite(series.values[i]) else 0)
        level = _mean(recent[-k:])
        diffs = sorted([b - a for a, b in pairwise(recent[-(n_noise + 1) :])])
        noise = math.nan
        if len(diffs) >= MIN_NOISE_POINTS:
            centre = _middle(diffs)
            noise = _MAD_TO_SIGMA * _middle(sorted([abs(d - centre) for d in diffs]))
        peak, peak_step = (before.peak, before.peak_step) if before else (math.nan, None)
        if i >= start and count >= k and not level <= peak:
            peak, peak_step = level, series.steps[i]
        return _Point(level, count, noise, peak, peak_step)

    # the cache key carries the settings, so two configurations never share points
    return series.derived(("reward-trend", k, n_noise, start), compute)


def _middle(ordered: list[float]) -> float:
    """The median of an already sorted, non-empty list."""
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _finite_back(values: list[float], i: int, n: int) -> list[float]:
    """The last ``n`` finite values at or before position ``i``, oldest first."""
    recent = [v for v in values[max(i - n + 1, 0) : i + 1] if math.isfinite(v)]
    if len(recent) == n or i < n:  # the common case: no NaN among the last n
        return recent
    out: list[float] = []
    j = i
    while j >= 0 and len(out) < n:
        if math.isfinite(values[j]):
            out.append(values[j])
        j -= 1
    out.reverse()
    return out


def _running(series: Series, pick: Callable[[float, float], float]) -> list[float]:
    """Per position, the running ``pick`` (max or min) of the finite values so far (NaN before one)."""

    def compute(i: int, earlier: list[float]) -> float:
        value, before = series.values[i], earlier[-1] if earlier else math.nan
        if not math.isfinite(value):
            return before
        return value if not math.isfinite(before) else pick(before, value)

    return series.derived(("running", pick.__name__), compute)


def _at(series: Series, values: list[float], step: int) -> float | None:
    i = bisect_right(series.steps, step) - 1
    return values[i] if i >= 0 and math.isfinite(values[i]) else None


def best_sample_score(h: RunHistory, step: int) -> float | None:
    """The best score any sample reached up to ``step`` (verl's ``critic/score/max``, running maximum):
    the ceiling a saturated run sits at. Early batches of a fresh policy rarely hold a perfect sample."""
    series = h.signal(Signal.REWARD_MAX)
    return _at(series, _running(series, max), step)


def reward_scale(h: RunHistory, step: int) -> float | None:
    """The spread of one sample's score seen up to ``step``: the best minus the worst sample (verl's
    ``critic/score/max`` and ``/min``), or, for a run that does not log them, the largest magnitude."""
    best = best_sample_score(h, step)
    lows = h.signal(Signal.REWARD_MIN)
    worst = _at(lows, _running(lows, min), step)
    if best is not None and worst is not None and best > worst:
        return best - worst
    reward = h.signal(Signal.REWARD)
    return _own_scale(reward, bisect_right(reward.steps, step) - 1)


@dataclass(frozen=True, slots=True)
class Trend:
    """A reward-like signal's trend at one step. Gains and drops are in the signal's own units."""

    step: int
    level: float
    noise: float  # sigma of one value
    level_sigma: float  # sigma of a difference of two levels
    baseline: float
    peak: float
    peak_step: int | None
    pace: float  # gain per step from the baseline to the peak (0 when the run has not learned)
    window: int  # steps over which "improving" was judged
    gain: float | None  # level now - level ``window`` steps ago (None: the run is younger than that)
    long_gain: float | None  # level now - level twice the window ago
    scale: float
    ceiling: float | None  # the best score any sample reached so far (None for a signal without one)
    saturated: bool
    converged: bool  # not improving, and within convergence_margin of the ceiling
    improving: bool
    falling: bool
    collapsed: bool
    z: float  # the significance the judgments used (improve_z)
    pace_fraction: float  # improve_pace_fraction

    @property
    def stalled(self) -> bool:
        """Confidently not learning: the gain over the window is significantly short of half the run's pace
        (or, for a run that has not learned yet, not significant at all), and the level is not falling."""
        if self.gain is None or self.improving or self.falling:
            return False
        return self.gain < self._stall_bar(self.window)

    @property
    def long_stalled(self) -> bool:
        """Stalled over twice the window as well: a plateau, not a slow stretch of a run still learning."""
        return self.stalled and self.long_gain is not None and self.long_gain < self._stall_bar(2 * self.window)

    def _stall_bar(self, steps: int) -> float:
        return max(self.pace_fraction * self.pace * steps - self.z * self.level_sigma, self.z * self.level_sigma)

    @property
    def expected_gain(self) -> float:
        """What the run's own pace would have gained over the window."""
        return self.pace * self.window

    @property
    def drop_from_peak(self) -> float:
        return max(self.peak - self.level, 0.0) if math.isfinite(self.peak) else 0.0

    def describe(self, key: str) -> str:
        """``critic/score/mean 0.53 ± 0.01, +0.01 over 5 steps (its pace: +0.14)``."""
        text = f"{key} {self.level:.3g} ± {self.noise:.2g}"
        if self.gain is not None:
            text += f", {self.gain:+.2g} over {self.window} steps"
            if self.pace > 0:
                text += f" (its pace: {self.expected_gain:+.2g})"
        return text


def reward_trend_at(
    h: RunHistory, step: int, cfg: RewardCollapseConfig, bcfg: BaselineConfig, signal: Signal | None = None
) -> Trend | None:
    """The trend of the reward (or of ``signal``, e.g. the validation score) at ``step``; None until the
    baseline and the noise are known. Every check asks it of the last few steps on every tick, so each
    position's answer is cached on the series (the history forgets it when the series, or the best and
    worst sample scores it was judged against, change at or before that step)."""
    series = h.signal(signal or Signal.REWARD)
    i = bisect_right(series.steps, step) - 1
    if i < 0:
        return None
    own = signal in (None, Signal.REWARD)

    def compute(j: int, _earlier: list[Trend | None]) -> Trend | None:
        at = series.steps[j]
        scale = reward_scale(h, at) if own else _own_scale(series, j)
        return _trend(series, j, scale, best_sample_score(h, at) if own else None, cfg, bcfg)

    trend: Trend | None = series.derived(("trend", cfg.cache_key, bcfg.cache_key), compute)[i]
    return trend


def _trend(
    series: Series, i: int, scale: float | None, best: float | None, cfg: RewardCollapseConfig, bcfg: BaselineConfig
) -> Trend | None:
    base = baseline(series, bcfg)
    points = _points(series, cfg, bcfg)
    point = points[i]
    if base is None or scale is None or not math.isfinite(point.noise) or not math.isfinite(point.level):
        return None
    k = cfg.level_steps
    noise = max(point.noise, 1e-9 * scale)
    level_sigma = noise * math.sqrt(2.0 / k)  # sigma of the difference of two levels
    peak = point.peak if math.isfinite(point.peak) else point.level
    base_step = series.steps[min(bcfg.warmup_steps + bcfg.steps, len(series)) - 1]
    pace = 0.0
    if point.peak_step is not None and peak > base:
        pace = (peak - base) / max(point.peak_step - base_step, 1)
    window = cfg.window_max_steps
    if pace > 0:
        window = math.ceil(2 * cfg.improve_z * level_sigma / pace)
        window = min(max(window, cfg.window_min_steps), cfg.window_max_steps)
    j = bisect_right(series.steps, series.steps[i] - window) - 1
    gain = None
    if j >= 0 and points[j].count >= min(k, point.count) and math.isfinite(points[j].level):
        window = series.steps[i] - series.steps[j]
        gain = point.level - points[j].level
    j2 = bisect_right(series.steps, series.steps[i] - 2 * window) - 1
    long_gain = point.level - points[j2].level if j2 >= 0 and math.isfinite(points[j2].level) else None
    improving = gain is not None and (
        gain > cfg.improve_z * level_sigma and gain >= cfg.improve_pace_fraction * pace * window
    )
    collapsed = _lost_or_below_start(series, point, noise, scale, cfg, bcfg)
    fell = gain is not None and -gain > cfg.drop_z * level_sigma and -gain >= cfg.warn_drop * scale
    saturated = best is not None and point.level >= best - cfg.saturation_margin * scale
    return Trend(
        step=series.steps[i],
        level=point.level,
        noise=noise,
        level_sigma=level_sigma,
        baseline=base,
        peak=peak,
        peak_step=point.peak_step,
        pace=pace,
        window=window,
        gain=gain,
        long_gain=long_gain,
        scale=scale,
        ceiling=best,
        saturated=saturated,
        converged=saturated
        or (best is not None and not improving and point.level >= best - cfg.convergence_margin * scale),
        improving=improving,
        falling=fell or collapsed,
        collapsed=collapsed,
        z=cfg.improve_z,
        pace_fraction=cfg.improve_pace_fraction,
    )


def _lost_or_below_start(
    series: Series, point: _Point, noise: float, scale: float, cfg: RewardCollapseConfig, bcfg: BaselineConfig
) -> bool:
    """The level is significantly below where the run started (the median of its first 2 x level_steps
    values), or it gave back ``critical_loss`` of a significant gain (and ``critical_drop`` of the scale).
    A run is judged at every step, so "significantly" grows with the number of level windows it has
    looked at (about sigma * sqrt(2 ln n), the luck of the best or worst of n noisy windows): a long flat
    noisy run neither "falls below its start" nor "falls from its peak" by chance."""
    k = cfg.level_steps
    if point.count < bcfg.warmup_steps + 2 * k:
        return False  # the start level is not known yet at this point (a later one must not judge it)
    start = series.baseline(bcfg.warmup_steps, 2 * k)
    if start is None:
        return False
    windows = max(point.count / k, 1.0)
    luck = math.sqrt(2 * math.log(windows)) if windows > 1 else 0.0
    sigma = noise / math.sqrt(k)  # of one level
    start_sigma = noise * math.sqrt(_MEDIAN_VARIANCE / (2 * k))
    margin = (cfg.drop_z + luck) * math.hypot(sigma, start_sigma)
    if start - point.level > margin:
        return True
    if not math.isfinite(point.peak):
        return False
    best = point.peak - luck * sigma
    gained, drop = best - start, best - point.level
    return (
        gained > margin
        and drop > (cfg.drop_z + luck) * sigma * math.sqrt(2)
        and drop >= cfg.critical_loss * gained
        and drop >= cfg.critical_drop * scale
    )


def _own_scale(series: Series, i: int) -> float | None:
    """The largest magnitude of the series up to position ``i``: the scale of a score without a known range."""
    if i < 0:
        return None
    seen = _running(series, _larger_magnitude)[i]
    return abs(seen) if math.isfinite(seen) and seen != 0 else None


def _larger_magnitude(a: float, b: float) -> float:
    return a if abs(a) >= abs(b) else b


def plateau_start(h: RunHistory, step: int, cfg: RewardCollapseConfig, bcfg: BaselineConfig) -> int | None:
    """The step where the reward first reached (within its noise) the level it holds at ``step``: where
    it stopped improving. Walks back over centred levels; None when the reward is unknown."""
    trend = reward_trend_at(h, step, cfg, bcfg)
    if trend is None:
        return None
    series = h.signal(Signal.REWARD)
    floor = trend.level - cfg.improve_z * trend.level_sigma
    finite = [(s, v) for s, v in zip(series.steps, series.values, strict=True) if s <= step and math.isfinite(v)]
    half = cfg.level_steps // 2
    first = len(finite) - 1
    for j in range(len(finite) - 1, max(len(finite) - 1 - ONSET_LOOKBACK, -1), -1):
        around = [v for _, v in finite[max(j - half, 0) : j + half + 1]]
        if sum(around) / len(around) < floor:
            break
        first = j
    return finite[first][0]
