"""What a rescue achieved: the new branch against the branch it replaced. Pure: history in, figures out.

Proven = the failure shape gone (the incident's check healthy, or its signal better than on the abandoned branch
at the same steps) *and* the outcome held (reward and validation at least the abandoned branch's, within noise).
``policy.judge_probation`` reads these. Why: docs/decisions/0051-rescue-proof.md."""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise

from guardian.checks.trend import reward_trend_at
from guardian.config import ChecksConfig
from guardian.core import Finding, Severity
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


# the signal each check judges, and whether more of it is better (a rescue of that check is compared on it)
CHECK_SIGNALS: dict[str, tuple[Signal, bool]] = {
    "entropy_collapse": (Signal.ENTROPY, True),
    "entropy_explosion": (Signal.ENTROPY, False),
    "egr_collapse": (Signal.EGR, True),
    "kl_drift": (Signal.KL, False),
    "logprob_decline": (Signal.LOG_PPL, False),
    "length_collapse": (Signal.LENGTH_MEAN, True),
    "length_explosion": (Signal.LENGTH_MEAN, False),
    "truncation": (Signal.TRUNCATION, False),
    "reward_collapse": (Signal.REWARD, True),
}


@dataclass(frozen=True, slots=True)
class BranchComparison:
    """One signal on the new branch and on the abandoned one, averaged over the steps both logged."""

    key: str
    steps: int
    new: float
    abandoned: float
    tolerance: float
    higher_is_better: bool

    @property
    def at_least_as_good(self) -> bool:
        if self.higher_is_better:
            return self.new >= self.abandoned - self.tolerance
        return self.new <= self.abandoned + self.tolerance

    def to_json(self) -> dict[str, object]:
        return {
            "key": self.key,
            "steps": self.steps,
            "new": round(self.new, 6),
            "abandoned": round(self.abandoned, 6),
            "tolerance": round(self.tolerance, 6),
            "higher_is_better": self.higher_is_better,
            "at_least_as_good": self.at_least_as_good,
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
    # the new branch against the abandoned one at the same steps (None: no overlap, or no abandoned branch)
    reward_vs_abandoned: BranchComparison | None = None
    signal_vs_abandoned: BranchComparison | None = None

    @property
    def recovered(self) -> bool | None:
        """The reward at least the abandoned branch's at the same steps (before the branches overlap: back to
        its rollback-point level) and the validation score back to its rollback-point level; None while
        neither can be judged."""
        reward = self.reward_vs_abandoned.at_least_as_good if self.reward_vs_abandoned else None
        if reward is None and self.reward is not None:
            reward = self.reward.recovered
        known = [k for k in (reward, self.validation.recovered if self.validation else None) if k is not None]
        return all(known) if known else None

    @property
    def shape_gone(self) -> bool:
        """The incident's check is healthy, or its signal is better than on the abandoned branch."""
        beat = self.signal_vs_abandoned is not None and self.signal_vs_abandoned.at_least_as_good
        return self.signal_healthy or beat

    @property
    def proven(self) -> bool:
        return self.shape_gone and self.recovered is not False

    def describe(self) -> str:
        """The figures in plain words: "at the same 21 steps: reward 0.271 on the new branch vs 0.27 on the
        abandoned one (level, within ±0.014), entropy 0.324 vs 0.236 (higher); entropy_collapse: ok". The reward
        against the rollback point is said only where no abandoned branch can be compared (it decides then)."""
        document = self.to_json()
        parts = [versus] if (versus := _branches(document)) else []
        if self.reward is not None and self.reward_vs_abandoned is None:
            parts.append(_at_rollback(PLAIN[Signal.REWARD], self.reward))
        if self.validation is not None:
            parts.append(_at_rollback(PLAIN[Signal.VAL_SCORE], self.validation))
        if self.signal_check:
            parts.append(f"{self.signal_check}: {self.signal_message}")
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
            "reward_vs_abandoned": None if self.reward_vs_abandoned is None else self.reward_vs_abandoned.to_json(),
            "signal_vs_abandoned": None if self.signal_vs_abandoned is None else self.signal_vs_abandoned.to_json(),
            "recovered": self.recovered,
        }


def outcome_line(document: Mapping[str, object]) -> str:
    """An outcome as recorded (``Outcome.to_json``), in one line: "critic/score/mean 0.2 -> 0.299 (x1.50, back);
    at the same 21 steps: reward 0.271 on the new branch vs 0.27 on the abandoned one (level, within ±0.014),
    entropy 0.324 vs 0.236 (higher); signal healthy; 20 steps after the rollback"."""
    parts = []
    for name in ("reward", "validation"):
        c = document.get(name)
        if isinstance(c, Mapping):
            ratio = f"x{c['ratio']:.2f}, " if isinstance(c.get("ratio"), float) else ""
            verdict = "back" if c.get("recovered") else "below the rollback point"
            parts.append(
                f"{c.get('key')} {_figure(c.get('at_rollback'))} -> {_figure(c.get('now'))} ({ratio}{verdict})"
            )
    if versus := _branches(document):
        parts.append(versus)
    parts.append("signal healthy" if document.get("signal_healthy") else f"signal: {document.get('signal_message')}")
    parts.append(f"{document.get('steps_after')} steps after the rollback")
    return "; ".join(parts)


# the signals' names as people say them
PLAIN: dict[Signal, str] = {
    Signal.REWARD: "reward",
    Signal.VAL_SCORE: "validation score",
    Signal.ENTROPY: "entropy",
    Signal.KL: "KL",
    Signal.LOG_PPL: "log-perplexity",
    Signal.EGR: "EGR",
    Signal.LENGTH_MEAN: "mean response length",
    Signal.TRUNCATION: "truncation",
}


def _figure(value: object, spec: str = ".3g") -> str:
    return format(value, spec) if isinstance(value, int | float) and not isinstance(value, bool) else str(value)


def _relation(new: object, old: object, tolerance: object) -> str:
    """Where ``new`` lies against ``old`` and its noise: "higher", "lower" or "level, within ±tol"."""
    if not (isinstance(new, int | float) and isinstance(old, int | float) and isinstance(tolerance, int | float)):
        return "not comparable"
    if new > old + tolerance:
        return "higher"
    if new < old - tolerance:
        return "lower"
    return f"level, within ±{_figure(tolerance, '.2g')}"


def _at_rollback(name: str, c: Comparison) -> str:
    """``reward 0.3 vs 0.86 at the rollback point (lower)``."""
    relation = _relation(c.now, c.at_rollback, c.tolerance)
    return f"{name} {_figure(c.now)} vs {_figure(c.at_rollback)} at the rollback point ({relation})"


def _branches(document: Mapping[str, object]) -> str | None:
    """The new branch against the abandoned one at the same steps (``BranchComparison.to_json`` documents of the
    reward and of the incident's own signal): "at the same 21 steps: reward 0.271 on the new branch vs 0.27 on
    the abandoned one (level, within ±0.014), entropy 0.324 vs 0.236 (higher)"."""
    compared: list[tuple[str, Mapping[str, object]]] = []
    reward = document.get("reward_vs_abandoned")
    if isinstance(reward, Mapping):
        compared.append((PLAIN[Signal.REWARD], reward))
    own = document.get("signal_vs_abandoned")
    signal = CHECK_SIGNALS.get(str(document.get("signal_check")), (None, True))[0]
    if isinstance(own, Mapping) and signal is not Signal.REWARD:  # a reward check's own signal is said already
        compared.append((PLAIN.get(signal, str(own.get("key"))) if signal else str(own.get("key")), own))
    if not compared:
        return None
    counts = {b.get("steps") for _, b in compared}
    clauses = []
    for i, (name, b) in enumerate(compared):
        new, old = _figure(b.get("new")), _figure(b.get("abandoned"))
        sides = (" on the new branch", " on the abandoned one") if i == 0 else ("", "")
        over = "" if len(counts) == 1 else f" over {b.get('steps')} steps"
        relation = _relation(b.get("new"), b.get("abandoned"), b.get("tolerance"))
        clauses.append(f"{name} {new}{sides[0]} vs {old}{sides[1]}{over} ({relation})")
    lead = f"at the same {b.get('steps')} steps" if len(counts) == 1 else "at the same steps"
    return f"{lead}: " + ", ".join(clauses)


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
        reward_vs_abandoned=versus_abandoned(
            history, Signal.REWARD, higher_is_better=True, after=target_step, checks=checks
        ),
        signal_vs_abandoned=_versus_own(history, own_check, target_step, checks),
    )


def versus_abandoned(
    history: RunHistory, signal: Signal, *, higher_is_better: bool, after: int, checks: ChecksConfig
) -> BranchComparison | None:
    """The signal's mean over the steps both the active branch and the latest abandoned one logged after the
    rollback point ``after`` (verl's first line after a resume, at the rollback step itself, is the checkpoint's
    on both branches); the tolerance is ``improve_z`` sigmas of the difference of the two means (the signal's own
    step-to-step noise on both branches), at least ``recovery_tolerance`` of the abandoned mean."""
    old = history.abandoned.get(signal)
    if old is None or not len(old):
        return None
    new = history.signal(signal)
    pairs = [
        (v, old.values[i])
        for s, v in zip(new.steps, new.values, strict=True)
        if s > after and (i := _index(old, s)) is not None
    ]
    pairs = [(a, b) for a, b in pairs if math.isfinite(a) and math.isfinite(b)]
    if not pairs:
        return None
    n = len(pairs)
    mean_new, mean_old = sum(a for a, _ in pairs) / n, sum(b for _, b in pairs) / n
    noise = _scatter([a for a, _ in pairs] + [b for _, b in pairs])
    cfg = checks.reward_collapse
    tolerance = max(cfg.improve_z * noise * math.sqrt(2.0 / n), cfg.recovery_tolerance * abs(mean_old))
    key = history.key_of(signal)
    return BranchComparison(key, n, mean_new, mean_old, tolerance, higher_is_better)


def _versus_own(history: RunHistory, check: str | None, after: int, checks: ChecksConfig) -> BranchComparison | None:
    if check not in CHECK_SIGNALS:
        return None
    signal, higher_is_better = CHECK_SIGNALS[check]
    return versus_abandoned(history, signal, higher_is_better=higher_is_better, after=after, checks=checks)


def _index(series: Series, step: int) -> int | None:
    i = bisect_right(series.steps, step) - 1
    return i if i >= 0 and series.steps[i] == step else None


def _scatter(values: list[float]) -> float:
    """The step-to-step noise of one value: the spread of first differences over sqrt(2) (0 for fewer than 3)."""
    if len(values) < 3:
        return 0.0
    diffs = [b - a for a, b in pairwise(values)]
    mean = sum(diffs) / len(diffs)
    return math.sqrt(sum((d - mean) ** 2 for d in diffs) / len(diffs)) / math.sqrt(2.0)


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
