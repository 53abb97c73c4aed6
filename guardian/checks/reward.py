"""Reward collapse, and the reward facts other checks lean on (stalled, falling, saturated).

Reward scales differ between tasks (0..1 exact match, -1..1 distillation scores), so every reward
quantity is a fraction of the run's *reward scale*: the spread between verl's per-sample best and
worst score (``critic/score/max`` - ``critic/score/min``) at baseline, or, where a run does not log
them, the largest reward magnitude seen.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

from guardian.checks.base import (
    CheckContext,
    Verdict,
    baseline,
    baseline_end,
    conclude,
    judge,
    need,
    rounded,
)
from guardian.config import BaselineConfig, RewardCollapseConfig
from guardian.findings import EvidenceValue, Finding, Severity
from guardian.history import RunHistory
from guardian.keys import Signal

CHECK = "reward_collapse"


def reward_scale(h: RunHistory, bcfg: BaselineConfig) -> float | None:
    best = baseline(h.signal(Signal.REWARD_MAX), bcfg)
    worst = baseline(h.signal(Signal.REWARD_MIN), bcfg)
    if best is not None and worst is not None and best > worst:
        return best - worst
    reward = h.signal(Signal.REWARD)
    first = reward.baseline(bcfg.warmup_steps, bcfg.steps)
    scale = max(
        abs(first) if first is not None else 0.0, abs(reward.peak(bcfg.smooth_steps)[-1]) if len(reward) else 0.0
    )
    return scale if scale > 0 else None


@dataclass(frozen=True, slots=True)
class RewardState:
    """Reward facts at one step, each as a fraction of the reward scale."""

    drop_from_peak: float
    gain: float | None  # over the plateau window; None when the window is not yet covered
    saturated: bool
    stalled: bool
    falling: bool
    improving: bool


def reward_state_at(h: RunHistory, step: int, cfg: RewardCollapseConfig, bcfg: BaselineConfig) -> RewardState | None:
    series = h.signal(Signal.REWARD)
    i = bisect_right(series.steps, step) - 1
    scale = reward_scale(h, bcfg)
    if i < 0 or scale is None:
        return None
    smooth = series.smoothed(bcfg.smooth_steps)
    now = smooth[i]
    if not math.isfinite(now):
        return None
    drop = (series.peak(bcfg.smooth_steps)[i] - now) / scale
    j = bisect_right(series.steps, series.steps[i] - cfg.plateau_steps) - 1
    gain = (now - smooth[j]) / scale if j >= 0 and math.isfinite(smooth[j]) else None
    best = baseline(h.signal(Signal.REWARD_MAX), bcfg)
    saturated = best is not None and now >= best - cfg.saturation_margin * scale
    stalled = gain is not None and gain <= cfg.plateau_tolerance
    return RewardState(
        drop_from_peak=drop,
        gain=gain,
        saturated=saturated,
        stalled=stalled,
        falling=drop >= cfg.warn_drop,
        improving=gain is not None and gain > cfg.plateau_tolerance,
    )


def reward_collapse(ctx: CheckContext, cfg: RewardCollapseConfig) -> Finding:
    h = ctx.history
    if (missing := need(h, CHECK, Signal.REWARD)) is not None:
        return missing
    series = h.signal(Signal.REWARD)

    def level_at(i: int) -> Severity:
        state = reward_state_at(h, series.steps[i], cfg, ctx.baseline)
        if state is None:
            return Severity.UNKNOWN
        if state.drop_from_peak >= cfg.critical_drop:
            return Severity.CRITICAL
        return Severity.WARN if state.drop_from_peak >= cfg.warn_drop else Severity.OK

    ready = baseline(series, ctx.baseline) is not None
    verdict = judge(series, level_at, for_steps=cfg.for_steps, first_position=baseline_end(ctx.baseline))
    if not ready:
        verdict = Verdict(Severity.UNKNOWN, None)
    state = reward_state_at(h, series.steps[-1], cfg, ctx.baseline)
    drop = state.drop_from_peak if state else math.nan
    evidence: dict[str, EvidenceValue] = {
        "reward": rounded(series.smoothed(ctx.baseline.smooth_steps)[-1]),
        "reward_scale": rounded(reward_scale(h, ctx.baseline)),
        "drop_from_peak_fraction": rounded(drop),
        "gain_over_plateau_window": rounded(state.gain) if state else None,
    }
    return conclude(
        CHECK,
        series.steps[-1],
        verdict,
        evidence,
        healthy="reward holding",
        unhealthy=f"reward fell {drop:.0%} of its scale from its peak",
    )
