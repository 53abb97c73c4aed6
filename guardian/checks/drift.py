"""Signals that must not climb far above their early level: KL to the reference, mean -log pi.

KL units differ between verl keys (facts gotcha 8): ``actor/kl_loss`` is a per-token k3 mean
(0.001-0.1 in healthy runs), ``actor/reward_kl_penalty`` a per-sequence mean. Judging the ratio to the
run's own baseline (floored, so a run that starts at KL 0 has a finite reference) works for all.

KL grows as a policy learns (0.001 -> 0.013 on a healthy GSM8K run), so a KL far above its baseline is
critical only while reward is not improving, or when it is extreme; the policy moving away from the
reference while reward climbs is learning.

``rollout_corr/training_log_ppl`` is the mean -log pi per token of the sampled responses under the
old policy; it rising means the policy assigns its own samples less and less likelihood - the
likelihood-displacement signal the seed tutorial calls "mean log pi falling".
"""

from __future__ import annotations

import math
from collections.abc import Callable

from guardian.checks.base import (
    CheckContext,
    baseline,
    baseline_end,
    conclude,
    judge,
    need,
    ratio_to_baseline,
    rounded,
    waiting,
)
from guardian.checks.reward import reward_state_at
from guardian.config import KlDriftConfig, LogprobDeclineConfig, RewardCollapseConfig
from guardian.findings import EvidenceValue, Finding, Severity
from guardian.keys import Signal

KL = "kl_drift"
LOGPROB = "logprob_decline"


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
    h = ctx.history
    if (missing := need(h, check, signal)) is not None:
        return missing
    series = h.signal(signal)
    r = ratio_to_baseline(series, ctx.baseline, floor)
    if r is None:
        return waiting(check, h.last_step)
    ratio_of = r

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
        signal.value: rounded(series.smoothed(ctx.baseline.smooth_steps)[last]),
        f"{signal.value}_baseline": rounded(baseline(series, ctx.baseline)),
        "ratio_to_baseline": rounded(ratio_of(last)),
    }
    return conclude(check, series.steps[-1], verdict, evidence, healthy=healthy, unhealthy=unhealthy(ratio_of(last)))


def kl_drift(ctx: CheckContext, cfg: KlDriftConfig, reward_cfg: RewardCollapseConfig) -> Finding:
    def learning(step: int) -> bool:
        state = reward_state_at(ctx.history, step, reward_cfg, ctx.baseline)
        return state is not None and state.improving

    return _rise_check(
        ctx,
        check=KL,
        signal=Signal.KL,
        floor=cfg.floor,
        warn=cfg.warn_ratio,
        critical=cfg.critical_ratio,
        for_steps=cfg.for_steps,
        departed=1.5,
        healthy="KL to the reference near its baseline",
        excused=learning,
        extreme=cfg.extreme_ratio,
        unhealthy=lambda r: f"KL to the reference is {r:.1f}x its baseline",
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
        departed=1.2,
        healthy="mean log-prob of sampled tokens steady",
        unhealthy=lambda r: f"mean log-prob of sampled tokens fell: -log pi {r - 1:+.0%} vs baseline",
    )
