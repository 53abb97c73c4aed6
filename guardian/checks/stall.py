"""Stall: no new step for k times the run's typical step time; UNKNOWN in replay (it needs the wall clock).

Before a launch's first step the limit is ``startup_seconds`` (or ``startup_learned_factor`` × the first launch's);
a step that saves or validates gets ``save_seconds`` / ``validation_seconds`` more, and a change on disk restarts
the silence (``checks.signs``). A running trainer's silence is CRITICAL, an unknown one's a WARN, an exited one's
UNKNOWN. Why: docs/decisions/0009-stall-limit-from-the-runs-own-step-time.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

from guardian.checks.base import CheckContext, ok, rounded
from guardian.checks.signs import LifeSigns, startup_allowance
from guardian.config import StallConfig
from guardian.core import EvidenceValue, Finding, Severity, StepSchedule
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


@dataclass(frozen=True, slots=True)
class BusyStep:
    """The step in progress: what verl does at it besides training (``doing``), the extra silence that earns it,
    and when the disk last showed it alive (None: not seen)."""

    step: int
    doing: tuple[str, ...]
    extra_seconds: float
    life_at: float | None

    def evidence(self, now: float, allowed: float) -> dict[str, EvidenceValue]:
        seen = {} if self.life_at is None else {"seconds_since_sign_of_life": rounded(now - self.life_at)}
        return {"busy_step": self.step, "busy_with": ",".join(self.doing), "allowed_seconds": rounded(allowed), **seen}

    def arriving(self) -> str:
        return f"step {self.step} {' and '.join(self.doing)}: allowed longer"

    def why_too_long(self, now: float, allowed: float) -> str:
        grew = "" if self.life_at is None else f", its files last changed {now - self.life_at:.0f}s ago"
        return f"; step {self.step} {' and '.join(self.doing)}, allowed {allowed:.0f}s of silence{grew}"


def busy_step(step: int, schedule: StepSchedule | None, signs: LifeSigns | None, cfg: StallConfig) -> BusyStep:
    """Whether step ``step`` saves or validates (the run's schedule, or its folder or dump seen changing), the
    extra silence allowed for that, and its last sign of life on disk."""
    seen = signs if signs is not None and signs.step == step else LifeSigns()
    doing: list[str] = []
    extra = 0.0
    if (schedule is not None and schedule.saves(step)) or seen.saved_at is not None:
        doing.append("saves a checkpoint")
        extra += cfg.save_seconds
    if (schedule is not None and schedule.validates(step)) or seen.dumped_at is not None:
        doing.append("validates")
        extra += cfg.validation_seconds
    return BusyStep(step, tuple(doing), extra, seen.latest_at(step))


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
    assert h.last_step is not None  # an arrival is a step's
    busy = busy_step(h.last_step + 1, ctx.schedule, ctx.life_signs, cfg)
    quiet = silent if busy.life_at is None else ctx.now - max(last_arrival, busy.life_at)
    warn_after = max(cfg.warn_factor * typical, cfg.min_seconds) + busy.extra_seconds
    critical_after = max(cfg.critical_factor * typical, cfg.min_seconds) + busy.extra_seconds
    if busy.doing:
        evidence.update(busy.evidence(ctx.now, critical_after))
    if quiet < warn_after:
        return ok(CHECK, h.last_step, busy.arriving() if busy.doing else "steps arriving", evidence)
    message = f"no new step for {silent:.0f}s ({silent / typical:.1f}x the typical {typical:.3g}s step)"
    if busy.doing:
        message += busy.why_too_long(ctx.now, critical_after)
    severity = Severity.WARN
    if quiet >= critical_after:
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
    allowed = startup_allowance(cfg.startup_seconds, ctx.first_startup_s, cfg.startup_learned_factor)
    evidence: dict[str, EvidenceValue] = {
        "seconds_since_start": rounded(waited),
        "startup_allowance_seconds": rounded(allowed),
        "trainer_process": _trainer(ctx.trainer_alive),
    }
    if ctx.first_startup_s is not None:
        evidence["first_startup_seconds"] = rounded(ctx.first_startup_s)
    if waited < allowed:
        return ok(CHECK, None, "waiting for the first step", evidence)
    if ctx.trainer_alive:
        return Finding(CHECK, Severity.CRITICAL, None, f"no first step {waited:.0f}s after start", None, evidence)
    message = f"no first step {waited:.0f}s after start; {NO_PROCESS}: the run may not have started, or crashed or hung"
    return Finding(CHECK, Severity.WARN, None, message, None, evidence)
