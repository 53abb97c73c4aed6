"""Stall: no new step for k times the run's typical step time (NVRx computes hang timeouts the same
way, with a safety factor of 5). Until a (re)launched trainer logs its first step, the limit is
``startup_seconds`` from the launch instead. Needs the wall clock, so it is UNKNOWN in replay."""

from __future__ import annotations

import math
from itertools import pairwise

from guardian.checks.base import CheckContext, ok, rounded
from guardian.config import StallConfig
from guardian.findings import EvidenceValue, Finding, Severity
from guardian.history import RunHistory, median
from guardian.keys import Signal

CHECK = "stall"
TYPICAL_WINDOW = 20


def typical_step_seconds(h: RunHistory) -> float | None:
    """Median logged step time, else the median gap between step arrivals; None when unknown."""
    times = h.signal(Signal.STEP_TIME)
    logged = times.finite(len(times) - TYPICAL_WINDOW, len(times))
    if logged:
        return median(logged)
    arrived = [h.arrivals[s] for s in h.steps[-TYPICAL_WINDOW - 1 :] if s in h.arrivals]
    gaps = [b - a for a, b in pairwise(arrived) if b >= a]
    return median(gaps) if gaps else None


def stall(ctx: CheckContext, cfg: StallConfig) -> Finding:
    h = ctx.history
    if ctx.now is None:
        return Finding(CHECK, Severity.UNKNOWN, h.last_step, "no wall clock (replay)")
    last_arrival = h.arrivals.get(h.last_step) if h.last_step is not None else None
    launched_since = ctx.started_at is not None and (last_arrival is None or last_arrival < ctx.started_at)
    if last_arrival is None or launched_since:
        # no step yet from the current launch: verl spends minutes starting up, judge it by startup_seconds
        if ctx.started_at is None:
            return Finding(CHECK, Severity.UNKNOWN, None, "no steps yet")
        waited = ctx.now - ctx.started_at
        evidence: dict[str, EvidenceValue] = {"seconds_since_start": rounded(waited)}
        if waited >= cfg.startup_seconds:
            return Finding(CHECK, Severity.CRITICAL, None, f"no first step {waited:.0f}s after start", None, evidence)
        return ok(CHECK, None, "waiting for the first step", evidence)
    silent = ctx.now - last_arrival
    typical = typical_step_seconds(h)
    evidence = {"seconds_since_last_step": rounded(silent), "typical_step_seconds": rounded(typical)}
    if typical is None or not math.isfinite(typical):
        return ok(CHECK, h.last_step, "step time not known yet", evidence)
    warn_after = max(cfg.warn_factor * typical, cfg.min_seconds)
    critical_after = max(cfg.critical_factor * typical, cfg.min_seconds)
    if silent >= critical_after:
        severity = Severity.CRITICAL
    elif silent >= warn_after:
        severity = Severity.WARN
    else:
        return ok(CHECK, h.last_step, "steps arriving", evidence)
    return Finding(
        CHECK,
        severity,
        h.last_step,
        f"no new step for {silent:.0f}s ({silent / typical:.1f}x the typical {typical:.3g}s step)",
        h.last_step,
        evidence,
    )
