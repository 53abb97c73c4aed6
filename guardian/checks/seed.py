"""The seed tutorial's naive alert rules, reproduced as written, as a baseline for ``bench/detection.py``.

Every rule reports CRITICAL (each alert triggers a manual rescue). Known flaws kept on purpose: an entropy threshold
relative to the first value, an absolute KL threshold in a non-verl scale, and a log-prob ratio that fires when the
(negative) log-prob improves. Not for guarding runs.
"""

from __future__ import annotations

import math

from guardian.checks.base import CheckContext, need, ok, rounded
from guardian.core import Finding, Severity
from guardian.keys import Signal

ENTROPY_FRACTION = 0.3
EGR_BELOW = 0.4
KL_ABOVE = 8.0
LLD_AFTER_STEP = 500
LLD_WINDOW = 300
LLD_RATIO = 0.6


def _latest(ctx: CheckContext, signal: Signal) -> tuple[int, float] | None:
    s = ctx.history.signal(signal)
    for i in range(len(s) - 1, -1, -1):
        if math.isfinite(s.values[i]):
            return s.steps[i], s.values[i]
    return None


def seed_entropy(ctx: CheckContext) -> Finding:
    name = "seed_entropy_collapse"
    if (missing := need(ctx.history, name, Signal.ENTROPY)) is not None:
        return missing
    s = ctx.history.signal(Signal.ENTROPY)
    initial = next((v for v in s.values if math.isfinite(v)), math.nan)
    latest = _latest(ctx, Signal.ENTROPY)
    if latest is None or not latest[1] < ENTROPY_FRACTION * initial:
        return ok(name, s.steps[-1], "entropy >= 0.3 x initial", {})
    return Finding(
        name,
        Severity.CRITICAL,
        latest[0],
        "ENTROPY_COLLAPSE: entropy < 0.3 x initial",
        latest[0],
        {"entropy": rounded(latest[1]), "initial": rounded(initial)},
    )


def seed_egr(ctx: CheckContext) -> Finding:
    name = "seed_adv_collapse"
    if (missing := need(ctx.history, name, Signal.EGR)) is not None:
        return missing
    latest = _latest(ctx, Signal.EGR)
    if latest is None or not latest[1] < EGR_BELOW:
        return ok(name, ctx.history.last_step, "EGR >= 0.4", {})
    return Finding(
        name, Severity.CRITICAL, latest[0], "ADV_COLLAPSE: EGR < 0.4", latest[0], {"egr": rounded(latest[1])}
    )


def seed_kl(ctx: CheckContext) -> Finding:
    name = "seed_kl_drift"
    if (missing := need(ctx.history, name, Signal.KL)) is not None:
        return missing
    latest = _latest(ctx, Signal.KL)
    if latest is None or not latest[1] > KL_ABOVE:
        return ok(name, ctx.history.last_step, "KL <= 8", {})
    return Finding(name, Severity.CRITICAL, latest[0], "KL_DRIFT: KL > 8", latest[0], {"kl": rounded(latest[1])})


def seed_lld(ctx: CheckContext) -> Finding:
    name = "seed_lld_risk"
    if (missing := need(ctx.history, name, Signal.LOG_PPL)) is not None:
        return missing
    s = ctx.history.signal(Signal.LOG_PPL)
    step = s.steps[-1]
    recent = [-v for v in s.values[-LLD_WINDOW:]]  # mean log pi = -(mean -log pi)
    if step <= LLD_AFTER_STEP or not recent or recent[0] == 0 or not recent[-1] / recent[0] < LLD_RATIO:
        return ok(name, step, "log-prob ratio >= 0.6 (or before step 500)", {})
    return Finding(
        name,
        Severity.CRITICAL,
        step,
        "LLD_RISK: recent_logp[-1] / recent_logp[0] < 0.6",
        step,
        {"ratio": rounded(recent[-1] / recent[0])},
    )
