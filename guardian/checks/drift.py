"""Signals that must not climb far above their early level: KL to the reference, mean -log pi.

KL units differ between verl keys (``actor/kl_loss`` per token, ``actor/reward_kl_penalty`` per sequence), so KL is
judged by how fast it grows (``kl_drift``). ``rollout_corr/training_log_ppl`` rising means the policy gives its own
samples less likelihood (``logprob_decline``).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable

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
from guardian.config import KlDriftConfig, LogprobDeclineConfig
from guardian.core import EvidenceValue, Finding, Severity
from guardian.keys import Signal

KL = "kl_drift"
LOGPROB = "logprob_decline"
# what a KL key may measure besides KL to the reference (said in the finding, so a reader can judge it)
KL_KEY_NOTES: dict[str, str] = {
    "actor/reward_kl_penalty": " (in-reward KL; in distillation forks this key may hold KL to a teacher)",
}


def _rise_check(
    ctx: CheckContext,
    *,
    check: str,
    signal: Signal,
    floor: float,
    warn: float,
    critical: float,
    for_steps: int,
    departed: float,
    healthy: str,
    unhealthy: Callable[[float], str],
    excused: Callable[[int], bool] = lambda step: False,
    extreme: float = math.inf,
) -> Finding:
    got = signal_ratio(ctx, check, signal, floor)
    if isinstance(got, Finding):
        return got
    series, ratio_of = got

    def level_at(i: int) -> Severity:
        value = ratio_of(i)
        if value >= extreme or (value >= critical and not excused(series.steps[i])):
            return Severity.CRITICAL
        return Severity.WARN if value >= warn else Severity.OK

    verdict = judge(
        series,
        level_at,
        for_steps=for_steps,
        first_position=baseline_end(ctx.baseline),
        departed_at=lambda i: ratio_of(i) >= departed,
    )
    last = len(series) - 1
    evidence: dict[str, EvidenceValue] = {
        "key": ctx.history.key_of(signal),
        signal.value: rounded(series.smoothed(ctx.baseline.smooth_steps)[last]),
        f"{signal.value}_baseline": rounded(baseline(series, ctx.baseline)),
        "ratio_to_baseline": rounded(ratio_of(last)),
    }
    return conclude(
        check, series.steps[-1], verdict, evidence, healthy=healthy, unhealthy=lambda: unhealthy(ratio_of(last))
    )


def kl_drift(ctx: CheckContext, cfg: KlDriftConfig) -> Finding:
    """KL to the reference *accelerating*: it grew ``critical_growth``× within ``window_steps`` while above the
    floor (a failure shape; ``warn_growth``×: out of band). KL starts at 0 (the policy is the reference) and
    healthy learning walks it up slowly (0.001 -> 0.013 over 100 steps on GSM8K); a blow-up multiplies it
    within a few steps (0.8 -> 16 in 8 steps, aopd-1). A level ratio to the first steps cannot tell the two
    apart; the growth rate can. KL also grows fast in any run that learns from a fresh start: whether the run
    still learns is the policy's call."""
    h = ctx.history
    if (missing := need(h, KL, Signal.KL)) is not None:
        return missing
    series = h.signal(Signal.KL)
    smooth = series.smoothed(ctx.baseline.smooth_steps)
    if len(series) < 2:
        return waiting(KL, h.last_step)

    def growth(i: int) -> float:
        j = max(bisect_right(series.steps, series.steps[i] - cfg.window_steps) - 1, 0)
        before, now = smooth[j], smooth[i]
        if not (math.isfinite(now) and math.isfinite(before)) or now < cfg.floor:
            return math.nan
        return now / max(before, cfg.floor / 2)

    def level_at(i: int) -> Severity:
        rate = growth(i)
        if not rate >= cfg.warn_growth:
            return Severity.OK
        return Severity.CRITICAL if rate >= cfg.critical_growth else Severity.WARN

    verdict = judge(
        series, level_at, for_steps=cfg.for_steps, first_position=1, departed_at=lambda i: growth(i) >= cfg.onset_growth
    )
    last = len(series) - 1
    rate = growth(last)
    key = h.key_of(Signal.KL)
    evidence: dict[str, EvidenceValue] = {
        "key": key,
        "kl": rounded(smooth[last]),
        "kl_growth_over_window": rounded(rate),
        "window_steps": cfg.window_steps,
    }
    return conclude(
        KL,
        series.steps[-1],
        verdict,
        evidence,
        healthy=f"{key} growing slowly, if at all",
        unhealthy=lambda: (
            f"{key} grew {rate:.1f}x in {cfg.window_steps} steps (now {smooth[last]:.3g})" + KL_KEY_NOTES.get(key, "")
        ),
    )


def logprob_decline(ctx: CheckContext, cfg: LogprobDeclineConfig) -> Finding:
    return _rise_check(
        ctx,
        check=LOGPROB,
        signal=Signal.LOG_PPL,
        floor=cfg.floor,
        warn=1 + cfg.warn_rise,
        critical=1 + cfg.critical_rise,
        for_steps=cfg.for_steps,
        departed=1 + cfg.onset_rise,
        healthy="mean log-prob of sampled tokens steady",
        unhealthy=lambda r: (
            f"mean log-prob of sampled tokens fell: {ctx.history.key_of(Signal.LOG_PPL)} (-log pi) "
            f"{r - 1:+.0%} vs baseline"
        ),
    )
