"""Stall: no new step for k times the run's typical step time (NVRx computes hang timeouts the same
way, with a safety factor of 5). Until a (re)launched trainer logs its first step, the limit is
``startup_seconds`` from the launch instead. Needs the wall clock, so it is UNKNOWN in replay.

Silence is read against what is known of the trainer process (``CheckContext.trainer_alive``):

- running (``guardian run``, ``watch --pid``): silence beyond the critical limit is a hang, CRITICAL;
- not known (``watch`` without ``--pid``): the same silence is a WARN that says what it suspects - the
  run may have finished, crashed or hung - since a file that stopped growing proves none of them;
- exited: not a stall (UNKNOWN; no recovery either). Whether the run is over is the watch loop's call,
  and a crash is the supervisor's.
"""

from __future__ import annotations

import math
from itertools import pairwise

from guardian.checks.base import CheckContext, ok, rounded
from guardian.checks.findings import EvidenceValue, Finding, Severity
from guardian.config import StallConfig
from guardian.history.timeline import RunHistory, median
from guardian.keys import Signal

CHECK = "stall"
TYPICAL_WINDOW = 20
NO_PROCESS = "no trainer process to check (pass --pid)"


def typical_step_seconds(h: RunHistory) -> float | None:
    """Median logged step time, else the median gap between step arrivals; None when unknown."""
    times = h.signal(Signal.STEP_TIME)
    logged = times.finite(len(times) - TYPICAL_WINDOW, len(times))
    if logged:
        return median(logged)
    arrived = [h.arrivals[s] for s in h.steps[-TYPICAL_WINDOW - 1 :] if s in h.arrivals]
    gaps = [b - a for a, b in pairwise(arrived) if b >= a]
    return median(gaps) if gaps else None


def _trainer(alive: bool | None) -> str:
    return {True: "running", False: "exited", None: "unknown"}[alive]


def stall(ctx: CheckContext, cfg: StallConfig) -> Finding:
    h = ctx.history
    if ctx.now is None:
        return Finding(CHECK, Severity.UNKNOWN, h.last_step, "no wall clock (replay)")
    if ctx.trainer_alive is False:
        return Finding(CHECK, Severity.UNKNOWN, h.last_step, "the trainer process has exited: not a stall")
    last_arrival = h.arrivals.get(h.last_step) if h.last_step is not None else None
    launched_since = ctx.started_at is not None and (last_arrival is None or last_arrival < ctx.started_at)
    if last_arrival is None or launched_since:
        return _startup(ctx, cfg)
    silent = ctx.now - last_arrival
    typical = typical_step_seconds(h)
    evidence: dict[str, EvidenceValue] = {
        "seconds_since_last_step": rounded(silent),
        "typical_step_seconds": rounded(typical),
        "trainer_process": _trainer(ctx.trainer_alive),
    }
    if typical is None or not math.isfinite(typical):
        return ok(CHECK, h.last_step, "step time not known yet", evidence)
    warn_after = max(cfg.warn_factor * typical, cfg.min_seconds)
    critical_after = max(cfg.critical_factor * typical, cfg.min_seconds)
    if silent < warn_after:
        return ok(CHECK, h.last_step, "steps arriving", evidence)
    message = f"no new step for {silent:.0f}s ({silent / typical:.1f}x the typical {typical:.3g}s step)"
    severity = Severity.WARN
    if silent >= critical_after:
        if ctx.trainer_alive:
            severity = Severity.CRITICAL
        else:
            message += f"; {NO_PROCESS}: the run may have finished, crashed or hung"
    return Finding(CHECK, severity, h.last_step, message, h.last_step, evidence)


def _startup(ctx: CheckContext, cfg: StallConfig) -> Finding:
    """No step yet from the current launch: verl spends minutes starting up, judged by ``startup_seconds``."""
    if ctx.started_at is None or ctx.now is None:
        return Finding(CHECK, Severity.UNKNOWN, None, "no steps yet")
    waited = ctx.now - ctx.started_at
    evidence: dict[str, EvidenceValue] = {
        "seconds_since_start": rounded(waited),
        "trainer_process": _trainer(ctx.trainer_alive),
    }
    if waited < cfg.startup_seconds:
        return ok(CHECK, None, "waiting for the first step", evidence)
    if ctx.trainer_alive:
        return Finding(CHECK, Severity.CRITICAL, None, f"no first step {waited:.0f}s after start", None, evidence)
    message = f"no first step {waited:.0f}s after start; {NO_PROCESS}: the run may not have started, or crashed or hung"
    return Finding(CHECK, Severity.WARN, None, message, None, evidence)
