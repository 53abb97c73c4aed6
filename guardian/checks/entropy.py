"""Entropy collapse and entropy explosion, judged against the run's own early entropy.

Healthy RL sharpens the policy: on GSM8K entropy falls 0.5 -> 0.07 while reward climbs, so a low
entropy ratio alone is at most a warning. A collapse is entropy falling *and* the run no longer
learning from it: EGR low (groups all alike), or reward stalled or falling while not saturated. Only
a near-total loss of entropy (below ``extreme_ratio``) is critical without that corroboration, and
even then not while reward is still improving or at its ceiling.
"""

from __future__ import annotations

from guardian.checks.base import (
    CheckContext,
    baseline,
    baseline_end,
    conclude,
    judge,
    rounded,
    signal_ratio,
)
from guardian.checks.egr import egr_state_at
from guardian.checks.reward import reward_state_at
from guardian.config import (
    EgrCollapseConfig,
    EntropyCollapseConfig,
    EntropyExplosionConfig,
    RewardCollapseConfig,
)
from guardian.findings import EvidenceValue, Finding, Severity
from guardian.keys import Signal

COLLAPSE = "entropy_collapse"
EXPLOSION = "entropy_explosion"
DEPARTED_BELOW = 0.7  # onset: where smoothed entropy first fell 30 % below baseline in this decline
DEPARTED_ABOVE = 1.25


def entropy_collapse(
    ctx: CheckContext,
    cfg: EntropyCollapseConfig,
    reward_cfg: RewardCollapseConfig,
    egr_cfg: EgrCollapseConfig,
) -> Finding:
    h = ctx.history
    got = signal_ratio(ctx, COLLAPSE, Signal.ENTROPY)
    if isinstance(got, Finding):
        return got
    series, ratio_of = got

    def level_at(i: int) -> Severity:
        value = ratio_of(i)
        if not value < cfg.warn_ratio:
            return Severity.OK
        step = series.steps[i]
        reward = reward_state_at(h, step, reward_cfg, ctx.baseline)
        egr = egr_state_at(h, step, egr_cfg)
        if value < cfg.extreme_ratio and not (reward and (reward.improving or reward.saturated)):
            return Severity.CRITICAL
        stuck = reward is not None and (reward.stalled or reward.falling) and not reward.saturated
        if value < cfg.critical_ratio and (stuck or (egr is not None and egr.low(egr_cfg))):
            return Severity.CRITICAL
        return Severity.WARN

    verdict = judge(
        series,
        level_at,
        for_steps=cfg.for_steps,
        first_position=baseline_end(ctx.baseline),
        departed_at=lambda i: ratio_of(i) < DEPARTED_BELOW,
    )
    step = series.steps[-1]
    reward = reward_state_at(h, step, reward_cfg, ctx.baseline)
    egr = egr_state_at(h, step, egr_cfg)
    evidence: dict[str, EvidenceValue] = {
        "entropy": rounded(series.smoothed(ctx.baseline.smooth_steps)[-1]),
        "entropy_baseline": rounded(baseline(series, ctx.baseline)),
        "entropy_ratio": rounded(ratio_of(len(series) - 1)),
        "reward_gain_over_window": rounded(reward.gain) if reward else None,
        "reward_saturated": None if reward is None else str(reward.saturated).lower(),
        "egr": rounded(egr.egr) if egr else None,
    }
    if verdict.severity == Severity.CRITICAL:
        why = "and the run stopped learning" if reward or egr else "to almost nothing"
    else:
        why = "while reward still improves (learning)" if reward and reward.improving else ""
    return conclude(
        COLLAPSE,
        step,
        verdict,
        evidence,
        healthy="entropy within range of its baseline",
        unhealthy=f"entropy fell to {ratio_of(len(series) - 1):.0%} of its baseline {why}".rstrip(),
    )


def entropy_explosion(ctx: CheckContext, cfg: EntropyExplosionConfig, reward_cfg: RewardCollapseConfig) -> Finding:
    h = ctx.history
    got = signal_ratio(ctx, EXPLOSION, Signal.ENTROPY)
    if isinstance(got, Finding):
        return got
    series, ratio_of = got
    smooth = series.smoothed(ctx.baseline.smooth_steps)

    def level_at(i: int) -> Severity:
        value = ratio_of(i)
        if not (value >= cfg.warn_ratio and smooth[i] >= cfg.min_entropy):
            return Severity.OK
        if value >= cfg.critical_ratio:
            return Severity.CRITICAL
        reward = reward_state_at(h, series.steps[i], reward_cfg, ctx.baseline)
        return Severity.CRITICAL if reward is not None and reward.falling else Severity.WARN

    verdict = judge(
        series,
        level_at,
        for_steps=cfg.for_steps,
        first_position=baseline_end(ctx.baseline),
        departed_at=lambda i: ratio_of(i) >= DEPARTED_ABOVE,
    )
    last = len(series) - 1
    evidence: dict[str, EvidenceValue] = {
        "entropy": rounded(smooth[last]),
        "entropy_baseline": rounded(baseline(series, ctx.baseline)),
        "entropy_ratio": rounded(ratio_of(last)),
    }
    return conclude(
        EXPLOSION,
        series.steps[-1],
        verdict,
        evidence,
        healthy="entropy not rising",
        unhealthy=f"entropy rose to {ratio_of(last):.1f}x its baseline",
    )
