"""What a rescue achieved: the run's figures at the rollback point and after it. Pure: history in, figures out.

A rescue is proven when the signal that raised the incident is back in its healthy band *and* the reward
(and the validation score, when the run logs one on both sides) came back to at least its level at the
rollback point, judged against the run's own noise: "nothing critical for N steps" is not enough (a fix
that cuts the LR tenfold is quiet and learns nothing). ``policy.judge_probation`` reads these figures.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass

from guardian.checks.findings import Finding, Severity
from guardian.checks.trend import reward_trend_at
from guardian.config import ChecksConfig
from guardian.history.timeline import RunHistory, Series
from guardian.keys import Signal


@dataclass(frozen=True, slots=True)
class Comparison:
    """One signal before (at the rollback point) and after (the latest level on the new branch)."""

    key: str
    at_rollback: float
    now: float
    tolerance: float  # "at least its level" allows this much noise

    @property
    def recovered(self) -> bool:
        return self.now >= self.at_rollback - self.tolerance

    @property
    def ratio(self) -> float | None:
        """now / at the rollback point, for positive scores (a [-1, 1] score has no meaningful ratio)."""
        return self.now / self.at_rollback if self.at_rollback > 0 else None

    def to_json(self) -> dict[str, object]:
        return {
            "key": self.key,
            "at_rollback": round(self.at_rollback, 6),
            "now": round(self.now, 6),
            "tolerance": round(self.tolerance, 6),
            "ratio": None if self.ratio is None else round(self.ratio, 4),
            "recovered": self.recovered,
        }


@dataclass(frozen=True, slots=True)
class Outcome:
    """The figures probation judges, recorded on the intervention when it ends."""

    target_step: int
    newest_step: int | None
    steps_after: int
    signal_check: str | None  # the incident's own check (None: a crash or stall restart has none)
    signal_healthy: bool
    signal_message: str
    reward: Comparison | None  # None: no reward on one side yet (or none logged)
    validation: Comparison | None

    @property
    def recovered(self) -> bool | None:
        """Reward and validation back to their rollback-point levels; None while neither can be judged."""
        known = [c.recovered for c in (self.reward, self.validation) if c is not None]
        return all(known) if known else None

    @property
    def proven(self) -> bool:
        return self.signal_healthy and self.recovered is not False

    def describe(self) -> str:
        parts = [f"{self.signal_check}: {self.signal_message}"] if self.signal_check else []
        for c in (self.reward, self.validation):
            if c is not None:
                verdict = "back to" if c.recovered else "below"
                parts.append(
                    f"{c.key} {c.now:.3g} {verdict} {c.at_rollback:.3g} at the rollback point (±{c.tolerance:.2g})"
                )
        return "; ".join(parts) or "no figures yet"

    def to_json(self) -> dict[str, object]:
        return {
            "target_step": self.target_step,
            "newest_step": self.newest_step,
            "steps_after": self.steps_after,
            "signal_check": self.signal_check,
            "signal_healthy": self.signal_healthy,
            "signal_message": self.signal_message,
            "reward": None if self.reward is None else self.reward.to_json(),
            "validation": None if self.validation is None else self.validation.to_json(),
            "recovered": self.recovered,
        }


def outcome_line(document: Mapping[str, object]) -> str:
    """An outcome as recorded (``Outcome.to_json``), in one line: "critic/score/mean 0.31 -> 0.52 (x1.68,
    back), signal healthy, 21 steps after the rollback"."""
    parts = []
    for name in ("reward", "validation"):
        c = document.get(name)
        if isinstance(c, Mapping):
            ratio = f"x{c['ratio']:.2f}, " if isinstance(c.get("ratio"), float) else ""
            verdict = "back" if c.get("recovered") else "below the rollback point"
            parts.append(f"{c.get('key')} {c.get('at_rollback'):.3g} -> {c.get('now'):.3g} ({ratio}{verdict})")
    parts.append("signal healthy" if document.get("signal_healthy") else f"signal: {document.get('signal_message')}")
    parts.append(f"{document.get('steps_after')} steps after the rollback")
    return ", ".join(parts)


def measure_outcome(
    history: RunHistory, *, target_step: int, own: Finding | None, own_check: str | None, checks: ChecksConfig
) -> Outcome:
    """The rescue's figures now: ``own`` is the incident's own check's latest finding on the new branch."""
    newest = history.last_step
    after = [s for s in history.steps if s > target_step]
    return Outcome(
        target_step=target_step,
        newest_step=newest,
        steps_after=len(after),
        signal_check=own_check,
        signal_healthy=own is None or own.severity == Severity.UNKNOWN or own.healthy,
        signal_message="no finding yet" if own is None else _status(own),
        reward=_compare_reward(history, target_step, checks),
        validation=_compare_validation(history, target_step, checks),
    )


def _status(finding: Finding) -> str:
    if finding.severity == Severity.OK:
        return "ok"
    if finding.advice:
        return f"{finding.severity.label} (advice only)"
    return f"{finding.severity.label}: {finding.message}"


def _compare_reward(history: RunHistory, target: int, checks: ChecksConfig) -> Comparison | None:
    """The reward level (mean of ``level_steps`` steps) at the rollback point vs on the new branch; the
    tolerance is the noise of a difference of two levels times ``improve_z``."""
    cfg = checks.reward_collapse
    series = history.signal(Signal.REWARD)
    before = _level(series, target, cfg.level_steps, after=None)
    now = _level(series, series.steps[-1] if series.steps else target, cfg.level_steps, after=target)
    trend = reward_trend_at(history, target, cfg, checks.baseline)
    if before is None or now is None or trend is None:
        return None
    return Comparison(history.key_of(Signal.REWARD), before, now, cfg.improve_z * trend.level_sigma)


def _compare_validation(history: RunHistory, target: int, checks: ChecksConfig) -> Comparison | None:
    """The latest validation score at or before the rollback point vs the latest one after it (verl logs
    validation every ``test_freq`` steps, and once at the resume step: that one is the checkpoint's, so it
    counts as "before"). The tolerance is ``improve_z`` times the score's noise, or ``recovery_tolerance`` of
    its level while the noise is not known yet."""
    cfg = checks.reward_collapse
    series = history.signal(Signal.VAL_SCORE)
    i = bisect_right(series.steps, target) - 1
    if i < 0 or series.steps[-1] <= target:
        return None
    before, now = series.values[i], series.values[-1]
    if not (math.isfinite(before) and math.isfinite(now)):
        return None
    trend = reward_trend_at(history, target, cfg, checks.baseline, Signal.VAL_SCORE)
    tolerance = cfg.improve_z * trend.noise if trend is not None else cfg.recovery_tolerance * abs(before)
    return Comparison(history.key_of(Signal.VAL_SCORE), before, now, tolerance)


def _level(series: Series, step: int, k: int, *, after: int | None) -> float | None:
    """Mean of the last ``k`` finite values at or before ``step`` (only those after ``after`` when given);
    None until ``k`` of them exist."""
    values: list[float] = []
    i = bisect_right(series.steps, step) - 1
    while i >= 0 and len(values) < k and (after is None or series.steps[i] > after):
        if math.isfinite(series.values[i]):
            values.append(series.values[i])
        i -= 1
    return sum(values) / k if len(values) == k else None
