"""Gradient-norm spikes and non-finite numbers.

verl logs the grad norm before clipping and skips a non-finite step with only a warning: one NaN step is a warning,
NaN that persists is critical. A spike is judged against the median of the preceding steps; one spike is a warning
(clipping bounds its effect), spikes on ``for_steps`` steps in a row are critical.
"""

from __future__ import annotations

import math

from guardian.checks.base import CheckContext, need, ok, rounded
from guardian.config import GradSpikeConfig, NonFiniteConfig
from guardian.core import EvidenceValue, Finding, Severity
from guardian.history.timeline import median
from guardian.keys import Signal

GRAD = "grad_spike"
NON_FINITE = "non_finite"
MIN_REFERENCE_POINTS = 3


def grad_spike(ctx: CheckContext, cfg: GradSpikeConfig) -> Finding:
    h = ctx.history
    if (missing := need(h, GRAD, Signal.GRAD_NORM)) is not None:
        return missing
    series = h.signal(Signal.GRAD_NORM)

    def reference_at(i: int, _earlier: list[tuple[int, float]]) -> tuple[int, float]:
        """How many finite values the ``window`` steps before position ``i`` hold, and their median."""
        reference = series.finite(i - cfg.window, i)
        return len(reference), median(reference)

    references = series.derived(("grad-reference", cfg.window), reference_at)

    def spike_ratio(i: int) -> float:
        count, ref = references[i]
        if count < MIN_REFERENCE_POINTS or not math.isfinite(series.values[i]):
            return math.nan
        return series.values[i] / ref if ref > 0 else math.nan

    last = len(series) - 1
    recent = [spike_ratio(i) for i in range(max(0, last - cfg.for_steps + 1), last + 1)]
    now = recent[-1]
    sustained = len(recent) == cfg.for_steps and all(r >= cfg.warn_ratio for r in recent)
    if sustained:
        severity = Severity.CRITICAL
    elif now >= cfg.warn_ratio:
        severity = Severity.WARN
    else:
        severity = Severity.OK if math.isfinite(now) else Severity.UNKNOWN
    evidence: dict[str, EvidenceValue] = {
        "grad_norm": rounded(series.values[last]),
        "reference_median": rounded(references[last][1]),
        "ratio_to_reference": rounded(now),
    }
    if severity < Severity.WARN:
        if severity == Severity.UNKNOWN:
            return Finding(GRAD, severity, series.steps[-1], "too few steps for a reference yet", None, evidence)
        return ok(GRAD, series.steps[-1], "grad norm in its usual range", evidence)
    onset = last
    while onset > 0 and spike_ratio(onset - 1) >= cfg.warn_ratio:
        onset -= 1
    return Finding(
        GRAD,
        severity,
        series.steps[-1],
        f"grad norm {now:.0f}x the median of the previous {cfg.window} steps",
        series.steps[onset],
        evidence,
    )


def non_finite(ctx: CheckContext, cfg: NonFiniteConfig) -> Finding:
    h = ctx.history
    if h.last_step is None:
        return Finding(NON_FINITE, Severity.UNKNOWN, None, "no steps yet")
    run = 0
    for step in reversed(h.steps):
        if step not in h.non_finite:
            break
        run += 1
    if run == 0:
        return ok(NON_FINITE, h.last_step, "all watched values finite", {})
    keys = sorted(h.non_finite[h.last_step])
    onset = h.steps[len(h.steps) - run]
    severity = Severity.CRITICAL if run >= cfg.for_steps else Severity.WARN
    return Finding(
        NON_FINITE,
        severity,
        h.last_step,
        f"non-finite values for {run} step(s): {', '.join(keys)}",
        onset,
        {"steps_in_a_row": run, "keys": ",".join(keys)},
    )
