"""Effective group ratio (EGR) collapse: the share of GRPO groups with mixed rewards, the part that still teaches.

verl logs no EGR: the rollout source computes it from dumps, or it is estimated from DAPO's eviction counter.
Groups nearly all correct (or all wrong) are a curriculum warning, not a collapse; low EGR while the reward
improves or holds is the policy's call. Why: docs/decisions/0007-checks-report-shapes-one-policy-decides.md.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from guardian.checks.base import (
    CheckContext,
    baseline,
    conclude,
    judge,
    need,
    rounded,
)
from guardian.config import EgrCollapseConfig
from guardian.core import EvidenceValue, Finding, Severity
from guardian.history.timeline import RunHistory
from guardian.keys import Signal

CHECK = "egr_collapse"


@dataclass(frozen=True, slots=True)
class EgrState:
    egr: float
    all_zero: float | None
    all_one: float | None
    saturated: bool  # low EGR explained by all-one (or all-zero) groups

    def low(self, cfg: EgrCollapseConfig) -> bool:
        return self.egr < cfg.warn_below and not self.saturated


def egr_state_at(h: RunHistory, step: int, cfg: EgrCollapseConfig) -> EgrState | None:
    """The latest EGR at or before ``step``; None when the run has no EGR."""
    series = h.signal(Signal.EGR)
    i = bisect_right(series.steps, step) - 1
    if i < 0:
        return None
    at = series.steps[i]
    zero = h.value_at_or_before(Signal.GROUPS_ALL_ZERO, at)
    one = h.value_at_or_before(Signal.GROUPS_ALL_ONE, at)
    saturated = (zero is not None and zero >= cfg.saturation_fraction) or (
        one is not None and one >= cfg.saturation_fraction
    )
    return EgrState(series.values[i], zero, one, saturated)


def egr_collapse(ctx: CheckContext, cfg: EgrCollapseConfig) -> Finding:
    h = ctx.history
    if (missing := need(h, CHECK, Signal.EGR)) is not None:
        return missing
    series = h.signal(Signal.EGR)
    base = baseline(series, ctx.baseline)

    def level_at(i: int) -> Severity:
        state = egr_state_at(h, series.steps[i], cfg)
        if state is None or state.egr >= cfg.warn_below:
            return Severity.OK
        relative_ok = base is None or state.egr < cfg.relative_to_baseline * base
        low = state.egr < cfg.critical_below and relative_ok and not state.saturated
        return Severity.CRITICAL if low else Severity.WARN

    verdict = judge(
        series,
        level_at,
        for_steps=cfg.for_steps,
        first_position=0,
        departed_at=lambda i: series.values[i] < cfg.warn_below,
    )
    state = egr_state_at(h, series.steps[-1], cfg)
    assert state is not None
    evidence: dict[str, EvidenceValue] = {
        "egr": rounded(state.egr),
        "egr_baseline": rounded(base),
        "all_zero_group_fraction": rounded(state.all_zero),
        "all_one_group_fraction": rounded(state.all_one),
    }

    def unhealthy() -> str:
        why = ""
        if state.saturated:
            why = (
                " (most groups all-correct: data too easy)"
                if (state.all_one or 0) >= (state.all_zero or 0)
                else (" (most groups all-wrong: data too hard)")
            )
        return f"only {state.egr:.0%} of groups have mixed rewards{why}"

    return conclude(
        CHECK, series.steps[-1], verdict, evidence, healthy="groups still carry signal", unhealthy=unhealthy
    )
