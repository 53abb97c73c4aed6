"""Response length: collapse to a few tokens, runaway growth, and truncation at the length cap.

Growth is critical only when fast, truncation only well above the run's own starting level (healthy long-CoT runs
grow 4x, tight-cap runs shrink). The truncated share is derived in ``history.RunHistory`` (``derive_truncation``).
"""

from __future__ import annotations

import math
from bisect import bisect_right

from guardian.checks.base import (
    CheckContext,
    baseline,
    baseline_end,
    conclude,
    judge,
    need,
    rounded,
    signal_ratio,
    waiting,
)
from guardian.config import LengthConfig
from guardian.core import EvidenceValue, Finding, Severity
from guardian.history.timeline import Series
from guardian.keys import Signal

COLLAPSE = "length_collapse"
EXPLOSION = "length_explosion"
TRUNCATION = "truncation"
# the concrete fix a length finding names (a lower LR leaves the cap, and the incentive to grow, in place)
LENGTH_FIX = (
    "; raise data.max_response_length, or shape overlong answers (DAPO: reward.reward_manager.name=dapo "
    "with reward.reward_kwargs.overlong_buffer_cfg)"
)


def length_collapse(ctx: CheckContext, cfg: LengthConfig) -> Finding:
    got = signal_ratio(ctx, COLLAPSE, Signal.LENGTH_MEAN)
    if isinstance(got, Finding):
        return got
    series, ratio_of = got

    def level_at(i: int) -> Severity:
        value = ratio_of(i)
        if value < cfg.collapse_critical_ratio:
            return Severity.CRITICAL
        return Severity.WARN if value < cfg.collapse_warn_ratio else Severity.OK

    verdict = judge(
        series,
        level_at,
        for_steps=cfg.for_steps,
        first_position=baseline_end(ctx.baseline),
        departed_at=lambda i: ratio_of(i) < cfg.collapse_onset_ratio,
    )
    last = len(series) - 1
    evidence = _length_evidence(series, ctx, ratio_of(last))
    return conclude(
        COLLAPSE,
        series.steps[-1],
        verdict,
        evidence,
        healthy="response length near its baseline",
        unhealthy=lambda: f"responses shrank to {ratio_of(last):.0%} of their baseline length",
    )


def length_explosion(ctx: CheckContext, cfg: LengthConfig) -> Finding:
    """Responses growing fast to several times their starting length: a failure shape (long-CoT runs grow 4x
    and learn: whether the run still learns is the policy's call)."""
    got = signal_ratio(ctx, EXPLOSION, Signal.LENGTH_MEAN)
    if isinstance(got, Finding):
        return got
    series, ratio_of = got
    smooth = series.smoothed(ctx.baseline.smooth_steps)

    def growth(i: int) -> float:
        j = bisect_right(series.steps, series.steps[i] - cfg.fast_window_steps) - 1
        return smooth[i] / smooth[j] if j >= 0 and smooth[j] > 0 else math.nan

    def level_at(i: int) -> Severity:
        value = ratio_of(i)
        if not value > cfg.explosion_warn_ratio:
            return Severity.OK
        fast = growth(i) >= cfg.explosion_fast_growth
        runaway = value > cfg.explosion_critical_ratio and fast
        return Severity.CRITICAL if runaway else Severity.WARN

    verdict = judge(
        series,
        level_at,
        for_steps=cfg.for_steps,
        first_position=baseline_end(ctx.baseline),
        departed_at=lambda i: ratio_of(i) > cfg.explosion_onset_ratio,
    )
    last = len(series) - 1
    evidence = _length_evidence(series, ctx, ratio_of(last))
    evidence["growth_over_fast_window"] = rounded(growth(last))
    if verdict.severity == Severity.CRITICAL:
        evidence["fast"] = True  # a runaway is fast growth by definition
    return conclude(
        EXPLOSION,
        series.steps[-1],
        verdict,
        evidence,
        healthy="response length not running away",
        unhealthy=lambda: (
            f"{ctx.history.key_of(Signal.LENGTH_MEAN)} grew to {ratio_of(last):.1f}x its baseline" + LENGTH_FIX
        ),
    )


def truncation(ctx: CheckContext, cfg: LengthConfig) -> Finding:
    """Responses cut at ``data.max_response_length``. Growing toward the cap is often learning (longer
    reasoning), and a rollback with a lower LR leaves the cap where it is, so many cut responses are a
    warning that names the fix; many, far above the run's start, is a failure shape (every answer at the cap
    with the reward fine stays a warning: the policy's call)."""
    h = ctx.history
    if (missing := need(h, TRUNCATION, Signal.TRUNCATION)) is not None:
        return missing
    series = h.signal(Signal.TRUNCATION)
    base = baseline(series, ctx.baseline)
    if base is None:
        return waiting(TRUNCATION, h.last_step)
    smooth = series.smoothed(ctx.baseline.smooth_steps)

    def level_at(i: int) -> Severity:
        share = smooth[i]
        if not share >= cfg.truncation_warn:
            return Severity.OK
        many = share >= cfg.truncation_critical and share >= base + cfg.truncation_rise
        return Severity.CRITICAL if many else Severity.WARN

    verdict = judge(
        series,
        level_at,
        for_steps=cfg.for_steps,
        first_position=baseline_end(ctx.baseline),
        departed_at=lambda i: smooth[i] >= cfg.truncation_warn,
    )
    cap = h.length_cap
    evidence: dict[str, EvidenceValue] = {
        "key": h.key_of(Signal.LENGTH_CLIP_RATIO),
        "truncated_share": rounded(smooth[-1]),
        "truncated_share_baseline": rounded(base),
        "length_cap": rounded(cap),
    }

    def at_cap() -> str:
        tokens = f" ({cap:.0f} tokens)" if cap else ""
        return f"{smooth[-1]:.0%} of responses are cut at the length cap{tokens}{LENGTH_FIX}"

    return conclude(
        TRUNCATION,
        series.steps[-1],
        verdict,
        evidence,
        healthy="few responses hit the length cap",
        unhealthy=at_cap,
    )


def _length_evidence(series: Series, ctx: CheckContext, ratio_now: float) -> dict[str, EvidenceValue]:
    return {
        "length_mean": rounded(series.smoothed(ctx.baseline.smooth_steps)[-1]),
        "length_baseline": rounded(baseline(series, ctx.baseline)),
        "ratio_to_baseline": rounded(ratio_now),
    }
