"""Reward collapse: the reward level fell well below its best, judged against the run's own noise.

A fall is a warning when significant (``drop_z`` sigmas) and material (``warn_drop`` of the scale); critical when
the run also lost ``critical_loss`` of its gain or fell below its start. The trend itself lives in ``trend.py``.
"""

from __future__ import annotations

import math

from guardian.checks.base import CheckContext, Verdict, conclude, judge, need, rounded
from guardian.checks.trend import Trend, reward_trend_at
from guardian.config import RewardCollapseConfig
from guardian.core import EvidenceValue, Finding, Severity
from guardian.keys import Signal

CHECK = "reward_collapse"


def reward_collapse(ctx: CheckContext, cfg: RewardCollapseConfig) -> Finding:
    h = ctx.history
    if (missing := need(h, CHECK, Signal.REWARD)) is not None:
        return missing
    series = h.signal(Signal.REWARD)

    def trend_at(i: int) -> Trend | None:
        return reward_trend_at(h, series.steps[i], cfg, ctx.baseline)

    def level_at(i: int) -> Severity:
        trend = trend_at(i)
        if trend is None:
            return Severity.UNKNOWN
        if trend.collapsed:
            return Severity.CRITICAL
        return Severity.WARN if trend.falling else Severity.OK

    def departed(i: int) -> bool:
        trend = trend_at(i)
        return trend is not None and trend.falling

    now = trend_at(len(series) - 1)
    if now is None:
        verdict = Verdict(Severity.UNKNOWN, None)
    else:
        verdict = judge(series, level_at, for_steps=cfg.for_steps, first_position=0, departed_at=departed)
    key = h.key_of(Signal.REWARD)
    evidence: dict[str, EvidenceValue] = {"key": key}
    if now is not None:
        evidence.update(
            {
                "reward": rounded(now.level),
                "reward_best": rounded(now.peak),
                "reward_start": rounded(now.baseline),
                "noise": rounded(now.noise),
                "drop_from_best": rounded(now.drop_from_peak),
                "reward_scale": rounded(now.scale),
            }
        )
    healthy = f"{key} holding"
    trend = now

    def message() -> str:
        return healthy if trend is None else _fall_message(key, trend)

    return conclude(CHECK, series.steps[-1], verdict, evidence, healthy=healthy, unhealthy=message)


def _fall_message(key: str, t: Trend) -> str:
    text = f"{key} fell to {t.level:.3g} from its best {t.peak:.3g} (noise ±{t.noise:.2g})"
    if t.level < t.baseline:
        return f"{text}, below where the run started ({t.baseline:.3g})"
    gained = t.peak - t.baseline
    if gained > 0 and math.isfinite(gained):
        return f"{text}: lost {t.drop_from_peak / gained:.0%} of what it had gained"
    return text
