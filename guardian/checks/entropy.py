"""Entropy collapse and explosion: the shape of the entropy curve against the run's early level.

The reference is the median of the first steps, or the highest smoothed level over twice that span. Collapse shapes
(fast, deep, EGR) are CRITICAL before the policy weighs them; dead entropy (below ``dead_ratio`` soon after half the
reference) is a hard failure; explosion past ``warn_ratio`` is a WARN, above ``min_entropy`` too a failure shape.
Whether the run still learns is the policy's call. Why: docs/decisions/0007-checks-report-shapes-one-policy-decides.md.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

from guardian.checks.base import (
    CheckContext,
    Verdict,
    baseline_end,
    conclude,
    judge,
    rounded,
    signal_baseline,
)
from guardian.checks.egr import EgrState, egr_state_at
from guardian.config import BaselineConfig, EgrCollapseConfig, EntropyCollapseConfig, EntropyExplosionConfig
from guardian.core import EvidenceValue, Finding, Severity
from guardian.history.timeline import Series
from guardian.keys import Signal

COLLAPSE = "entropy_collapse"
EXPLOSION = "entropy_explosion"


@dataclass(frozen=True, slots=True)
class _Assessment:
    severity: Severity
    reason: str  # dead, fast, deep, egr, low, ok
    ratio: float
    fell_from: tuple[int, float] | None  # (step, smoothed value) where a fast fall began
    egr: EgrState | None
    recent_loss: float | None  # share of entropy lost over the last fast_window_steps × 2


def early_reference(series: Series, base: float, cfg: BaselineConfig) -> float:
    """The run's early entropy: its baseline, or the highest smoothed level over twice the baseline's span."""
    smooth = series.smoothed(cfg.smooth_steps)
    early = [v for v in smooth[: 2 * baseline_end(cfg)] if math.isfinite(v)]
    return max([base, *early])


def entropy_collapse(ctx: CheckContext, cfg: EntropyCollapseConfig, egr_cfg: EgrCollapseConfig) -> Finding:
    h = ctx.history
    got = signal_baseline(ctx, COLLAPSE, Signal.ENTROPY)
    if isinstance(got, Finding):
        return got
    series, base = got
    ref = early_reference(series, base, ctx.baseline)
    smooth = series.smoothed(ctx.baseline.smooth_steps)
    assessed: dict[int, _Assessment] = {}  # the hysteresis and the evidence read the newest point twice

    def assess(i: int) -> _Assessment:
        if i not in assessed:
            assessed[i] = _assess(i)
        return assessed[i]

    def _assess(i: int) -> _Assessment:
        value = series.values[i]
        ratio = value / ref if math.isfinite(value) else math.nan
        if not math.isfinite(ratio):
            return _Assessment(Severity.UNKNOWN, "ok", ratio, None, None, None)
        if ratio >= cfg.fast_ratio and ratio >= cfg.warn_ratio:  # the common case: nothing to weigh
            return _Assessment(Severity.OK, "ok", ratio, None, None, None)
        fall = _fell_from(series, smooth, i, cfg.fast_drop, cfg.fast_window_steps)
        recent_loss = _loss_over(series, smooth, i, 2 * cfg.fast_window_steps)
        still_falling = recent_loss is not None and recent_loss >= cfg.still_falling
        if ratio < cfg.dead_ratio and _fell_from(
            series, smooth, i, value / (cfg.fast_ratio * ref), cfg.dead_window_steps
        ):
            return _Assessment(Severity.CRITICAL, "dead", ratio, fall, None, recent_loss)
        if fall is not None and ratio < cfg.fast_ratio:
            return _Assessment(Severity.CRITICAL, "fast", ratio, fall, None, recent_loss)
        if ratio < cfg.critical_ratio and (still_falling or ratio < cfg.dead_ratio):
            return _Assessment(Severity.CRITICAL, "deep", ratio, fall, None, recent_loss)
        if ratio < cfg.warn_ratio:
            egr = egr_state_at(h, series.steps[i], egr_cfg)
            if still_falling and egr is not None and egr.low(egr_cfg):
                return _Assessment(Severity.CRITICAL, "egr", ratio, fall, egr, recent_loss)
            return _Assessment(Severity.WARN, "low", ratio, fall, egr, recent_loss)
        return _Assessment(Severity.OK, "ok", ratio, fall, None, recent_loss)

    verdict = judge(
        series,
        lambda i: assess(i).severity,
        for_steps=cfg.for_steps,
        first_position=baseline_end(ctx.baseline),
        departed_at=lambda i: series.values[i] < cfg.onset_ratio * ref,
    )
    last = len(series) - 1
    now = assess(last)
    if verdict.severity >= Severity.WARN and now.fell_from is not None:
        # a fast fall began at or before where it fell from, but not long before (a run that learned for a while
        # below the onset band keeps that progress)
        fell = now.fell_from[0]
        onset = max(min(fell, verdict.onset_step or fell), fell - cfg.fast_window_steps)
        verdict = Verdict(verdict.severity, onset)
    key = h.key_of(Signal.ENTROPY)
    evidence: dict[str, EvidenceValue] = {
        "key": key,
        "entropy": rounded(series.values[last]),
        "entropy_reference": rounded(ref),
        "entropy_ratio": rounded(now.ratio),
        "entropy_lost_recently": rounded(now.recent_loss),
        "egr": rounded(now.egr.egr) if now.egr else None,
        "shape": now.reason,
    }
    if now.fell_from is not None:
        evidence.update({"fell_from": rounded(now.fell_from[1]), "fell_from_step": now.fell_from[0]})
    if verdict.severity == Severity.CRITICAL and now.reason in ("dead", "fast"):
        evidence["hard" if now.reason == "dead" else "fast"] = True
    text = _describe(now, key, ref)
    return conclude(COLLAPSE, series.steps[-1], verdict, evidence, healthy=text, unhealthy=text)


def _fell_from(series: Series, smooth: list[float], i: int, drop: float, window: int) -> tuple[int, float] | None:
    """Where, within ``window`` steps before position ``i``, the smoothed entropy still stood at 1/``drop`` times
    the value now or above (the nearest such point): a fall by that factor within the window. The fall starts
    from smoothed values, so one noisy high step is not the top of a fall."""
    value, step = series.values[i], series.steps[i]
    j = i - 1
    while j >= 0 and series.steps[j] >= step - window:
        before = smooth[j]
        if math.isfinite(before) and before > 0 and value <= drop * before:
            return series.steps[j], before
        j -= 1
    return None


def _loss_over(series: Series, smooth: list[float], i: int, steps: int) -> float | None:
    """Share of entropy lost over the last ``steps`` steps, between smoothed values (a near-zero entropy
    scatters by tens of percent step to step); None when the series is younger."""
    j = bisect_right(series.steps, series.steps[i] - steps) - 1
    if j < 0 or not (math.isfinite(smooth[j]) and smooth[j] > 0 and math.isfinite(smooth[i])):
        return None
    return 1.0 - smooth[i] / smooth[j]


def _describe(a: _Assessment, key: str, ref: float) -> str:
    level = f"{key} at {a.ratio:.0%} of its early level ({ref:.3g})"
    if a.reason == "dead" and a.fell_from is not None:
        return (
            f"{key} fell to {a.ratio * ref:.3g} ({a.ratio:.1%} of its early level) within a few steps: "
            "the policy went deterministic"
        )
    if a.reason == "dead":
        return f"{level}: the policy went deterministic within a few steps"
    if a.reason == "fast" and a.fell_from is not None:
        step, value = a.fell_from
        now = f"{a.ratio * ref:.3g} ({a.ratio:.0%} of its early level)"
        return f"{key} fell from {value:.3g} to {now} since step {step}"
    if a.reason == "deep":
        return f"{level} and still falling"
    if a.reason == "egr" and a.egr is not None:
        return (
            f"{level}, still falling, only {a.egr.egr:.0%} of groups with mixed rewards: the policy stopped exploring"
        )
    if a.reason == "low":
        return f"{level}, low but not falling fast"
    return f"{key} within range of its early level"


def entropy_explosion(ctx: CheckContext, cfg: EntropyExplosionConfig) -> Finding:
    """Entropy far above its baseline - judged on the raw value and the smoothed one together (a spike the
    raw series has already left is over); a failure shape only above an absolute floor of nats per token."""
    h = ctx.history
    got = signal_baseline(ctx, EXPLOSION, Signal.ENTROPY)
    if isinstance(got, Finding):
        return got
    series, base = got
    smooth = series.smoothed(ctx.baseline.smooth_steps)

    def held(i: int) -> float:
        """The level both the raw and the smoothed series hold at ``i``."""
        raw = series.values[i]
        return min(raw, smooth[i]) if math.isfinite(raw) else math.nan

    def level_at(i: int) -> Severity:
        value = held(i)
        ratio = value / base
        if not (ratio >= cfg.warn_ratio and value >= cfg.warn_min_entropy):
            return Severity.OK
        return Severity.WARN if value < cfg.min_entropy else Severity.CRITICAL

    verdict = judge(
        series,
        level_at,
        for_steps=cfg.for_steps,
        first_position=baseline_end(ctx.baseline),
        departed_at=lambda i: held(i) / base >= cfg.onset_ratio,
    )
    last = len(series) - 1
    key = h.key_of(Signal.ENTROPY)
    ratio = held(last) / base
    evidence: dict[str, EvidenceValue] = {
        "key": key,
        "entropy": rounded(series.values[last]),
        "entropy_smoothed": rounded(smooth[last]),
        "entropy_baseline": rounded(base),
        "entropy_ratio": rounded(ratio),
    }
    return conclude(
        EXPLOSION,
        series.steps[-1],
        verdict,
        evidence,
        healthy=f"{key} not rising",
        unhealthy=lambda: f"{key} rose to {ratio:.1f}x its baseline ({held(last):.3g} nats vs {base:.3g})",
    )
