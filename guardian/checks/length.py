"""Response length: collapse to a few tokens, runaway growth, and truncation at the length cap.

Length trends differ between healthy runs (long-CoT runs grow 4x over 100 steps, tight-cap runs
shrink), so growth is critical only when it is *fast*, and truncation only when it rose well above
the run's own starting level.
The truncated share is derived in ``history.RunHistory`` (see ``derive_truncation``).
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
from guardian.findings import EvidenceValue, Finding, Severity
from guardian.history import Series
from guardian.keys import Signal

COLLAPSE = "length_collapse"
EXPLOSION = "length_explosion"
TRUNCATION = "truncation"


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
        departed_at=lambda i: ratio_of(i) < 0.8,
    )
    last = len(series) - 1
    evidence = _length_evidence(series, ctx, ratio_of(last))
    return conclude(
        COLLAPSE,
        series.steps[-1],
        verdict,
        evidence,
        healthy="response length near its baseline",
        unhealthy=f"responses shrank to {ratio_of(last):.0%} of their baseline length",
    )


def length_explosion(ctx: CheckContext, cfg: LengthConfig) -> Finding:
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
        return Severity.CRITICAL if value > cfg.explosion_critical_ratio and fast else Severity.WARN

    verdict = judge(
        series,
        level_at,
        for_steps=cfg.for_steps,
        first_position=baseline_end(ctx.baseline),
        departed_at=lambda i: ratio_of(i) > 1.3,
    )
    last = len(series) - 1
    evidence = _length_evidence(series, ctx, ratio_of(last))
    evidence["growth_over_fast_window"] = rounded(growth(last))
    return conclude(
        EXPLOSION,
        series.steps[-1],
        verdict,
        evidence,
        healthy="response length not running away",
        unhealthy=f"responses grew to {ratio_of(last):.1f}x their baseline length",
    )


def truncation(ctx: CheckContext, cfg: LengthConfig) -> Finding:
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
        if share >= cfg.truncation_critical and share >= base + cfg.truncation_rise:
            return Severity.CRITICAL
        return Severity.WARN if share >= cfg.truncation_warn else Severity.OK

    verdict = judge(series, level_at, for_steps=cfg.for_steps, first_position=baseline_end(ctx.baseline))
    evidence: dict[str, EvidenceValue] = {
        "truncated_share": rounded(smooth[-1]),
        "truncated_share_baseline": rounded(base),
    }
    return conclude(
        TRUNCATION,
        series.steps[-1],
        verdict,
        evidence,
        healthy="few responses hit the length cap",
        unhealthy=f"{smooth[-1]:.0%} of responses are cut at the length cap",
    )


def _length_evidence(series: Series, ctx: CheckContext, ratio_now: float) -> dict[str, EvidenceValue]:
    return {
        "length_mean": rounded(series.smoothed(ctx.baseline.smooth_steps)[-1]),
        "length_baseline": rounded(baseline(series, ctx.baseline)),
        "ratio_to_baseline": rounded(ratio_now),
    }
