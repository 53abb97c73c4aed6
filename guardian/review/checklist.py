"""The launch checklist: is a run ready to launch at scale? Pure: ``RunFacts`` and settings in, one ``Item`` per
question out (pass, warn or fail).

Health items judge the run's end against its own baseline, as the live checks do; then how incidents ended,
a healthy checkpoint to launch from, the top samples (always "read these") and the recorded evaluations."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from guardian.checks.base import baseline
from guardian.checks.trend import reward_trend_at
from guardian.config import ChecklistConfig, ChecksConfig
from guardian.core import Severity
from guardian.history.timeline import RunHistory, Series
from guardian.keys import Signal
from guardian.review.incidents import IncidentRow
from guardian.review.samples import SampleReview
from guardian.states import IncidentStatus, State, Verdict
from guardian.store import CheckpointView, EvaluationView, RunView

PER_STEPS = 100  # entropy's decline is told per this many steps


class Mark(StrEnum):
    """An item's verdict."""

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"


Details = Mapping[str, object]


@dataclass(frozen=True, slots=True)
class Item:
    """One question of the checklist, its answer and why."""

    name: str
    mark: Mark
    reason: str
    details: Details = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "mark": self.mark, "reason": self.reason, "details": dict(self.details)}


@dataclass(frozen=True, slots=True)
class RunFacts:
    """What the checklist judges, read from the store and the run's files."""

    run: RunView
    history: RunHistory  # the active timeline, rebuilt from the stored steps
    incidents: tuple[IncidentRow, ...]
    checkpoints: tuple[CheckpointView, ...]
    present: frozenset[str]  # the checkpoint paths a rollback could land on (resumable, or pinned)
    samples: SampleReview
    rollout_folders: tuple[str, ...]  # where dumps were looked for
    evaluations: tuple[EvaluationView, ...]  # the newest result of each name


@dataclass(frozen=True, slots=True)
class Checklist:
    run_id: str
    last_step: int | None
    items: tuple[Item, ...]

    @property
    def failed(self) -> bool:
        return any(i.mark is Mark.FAIL for i in self.items)

    @property
    def verdict(self) -> Mark:
        marks = {i.mark for i in self.items}
        return Mark.FAIL if Mark.FAIL in marks else Mark.WARN if Mark.WARN in marks else Mark.PASS

    def to_json(self) -> dict[str, object]:
        return {
            "run_id": self.run_id,
            "last_step": self.last_step,
            "verdict": self.verdict,
            "items": [i.to_json() for i in self.items],
        }


# ------------------------------------------------------------------------------------------ reading a series


def end_level(series: Series, window: int) -> float | None:
    """The mean of the finite values among the series' last ``window`` points (None: none)."""
    values = series.finite(len(series) - window, len(series))
    return statistics.fmean(values) if values else None


def end_slope(series: Series, window: int) -> float | None:
    """The least-squares change per step over the last ``window`` points (None: fewer than 3 finite ones)."""
    start = max(len(series) - window, 0)
    points = [(s, v) for s, v in zip(series.steps[start:], series.values[start:], strict=True) if math.isfinite(v)]
    if len(points) < 3 or len({s for s, _ in points}) < 2:
        return None
    return statistics.linear_regression([float(s) for s, _ in points], [v for _, v in points]).slope


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


# ------------------------------------------------------------------------------------------ the items


def reward_item(h: RunHistory, checks: ChecksConfig) -> tuple[Item, bool]:
    """The reward's trend at the run's end, and whether it converged (near the best sample's score: low entropy
    there is no failure)."""
    name = "reward"
    if not h.has(Signal.REWARD) or h.last_step is None:
        return Item(name, Mark.WARN, "the run logs no reward: its learning cannot be judged"), False
    trend = reward_trend_at(h, h.last_step, checks.reward_collapse, checks.baseline)
    if trend is None:
        return Item(name, Mark.WARN, "too few steps to know the reward's noise and baseline"), False
    key = h.key_of(Signal.REWARD)
    gained = trend.level - trend.baseline
    learned = gained > trend.z * trend.level_sigma
    details = {
        "level": _r(trend.level),
        "baseline": _r(trend.baseline),
        "peak": _r(trend.peak),
        "peak_step": trend.peak_step,
        "noise": _r(trend.noise),
        "ceiling": _r(trend.ceiling),
        "improving": trend.improving,
        "stalled": trend.stalled,
        "falling": trend.falling,
        "collapsed": trend.collapsed,
        "converged": trend.converged,
    }
    said = trend.describe(key)
    if trend.collapsed or trend.falling:
        how = "collapsed" if trend.collapsed else "falling"
        best = f"; best level {trend.peak:.3g} at step {trend.peak_step}" if trend.peak_step is not None else ""
        reason = f"{how}: {said}{best}"
        return Item(name, Mark.FAIL, reason, details), False
    if trend.converged or trend.saturated:
        return Item(name, Mark.PASS, f"converged near the best sample's score: {said}", details), True
    if trend.improving:
        return Item(name, Mark.PASS, f"still improving: {said}", details), False
    if not learned:
        reason = f"no significant gain over the run ({gained:+.3g} from {trend.baseline:.3g}): {said}"
        return Item(name, Mark.WARN, reason, details), False
    if trend.long_stalled:
        return Item(
            name, Mark.WARN, f"plateau below the best sample's score after {gained:+.3g}: {said}", details
        ), False
    return Item(name, Mark.PASS, f"learned {gained:+.3g} from {trend.baseline:.3g}: {said}", details), False


def entropy_item(h: RunHistory, checks: ChecksConfig, cfg: ChecklistConfig, converged: bool) -> Item:
    name = "entropy"
    series = h.signal(Signal.ENTROPY)
    base = baseline(series, checks.baseline)
    level = end_level(series, cfg.level_steps)
    if base is None or base <= 0 or level is None:
        return Item(name, Mark.WARN, "the run logs no entropy (or too few steps for its baseline)")
    ratio = level / base
    slope = end_slope(series, cfg.window_steps)
    decline = -slope * PER_STEPS / base if slope is not None else None
    details = {
        "level": _r(level),
        "baseline": _r(base),
        "ratio": _r(ratio),
        f"decline_per_{PER_STEPS}_steps": _r(decline),
    }
    key = h.key_of(Signal.ENTROPY)
    said = f"{key} {level:.3g} at the end, {ratio:.0%} of its baseline {base:.3g}"
    if ratio < cfg.entropy_fail_ratio:
        if converged:
            return Item(name, Mark.WARN, f"{said}, with the reward converged: little exploration left", details)
        return Item(name, Mark.FAIL, f"{said}: collapsed", details)
    if ratio < cfg.entropy_warn_ratio:
        return Item(name, Mark.WARN, f"{said}: low", details)
    if decline is not None and decline > cfg.entropy_decline_warn:
        fall = f"still falling {decline:.0%} of its baseline per {PER_STEPS} steps"
        return Item(name, Mark.WARN, f"{said}, {fall}: a longer run at this rate collapses", details)
    return Item(name, Mark.PASS, said, details)


def kl_item(h: RunHistory, cfg: ChecklistConfig) -> Item:
    name = "kl"
    level = end_level(h.signal(Signal.KL), cfg.level_steps)
    if level is None:
        reason = "not logged (the run uses no KL loss or in-reward penalty): its drift from the reference is unmeasured"
        return Item(name, Mark.WARN, reason)
    said = f"{h.key_of(Signal.KL)} {level:.3g} nats/token at the end"
    details = {"level": _r(level)}
    if level > cfg.kl_fail:
        return Item(name, Mark.FAIL, f"{said}, above {cfg.kl_fail:g}: the policy ran away from the reference", details)
    if level > cfg.kl_warn:
        return Item(name, Mark.WARN, f"{said}, above {cfg.kl_warn:g}", details)
    return Item(name, Mark.PASS, said, details)


def egr_item(h: RunHistory, checks: ChecksConfig, cfg: ChecklistConfig) -> Item:
    name = "egr"
    level = end_level(h.signal(Signal.EGR), cfg.level_steps)
    if level is None:
        return Item(name, Mark.WARN, "unmeasured: no rollout dumps (trainer.rollout_data_dir) or DAPO eviction counts")
    all_one = end_level(h.signal(Signal.GROUPS_ALL_ONE), cfg.level_steps)
    easy = all_one is not None and all_one >= checks.egr_collapse.saturation_fraction
    said = f"effective group ratio {level:.2f} at the end"
    details = {"level": _r(level), "all_one_share": _r(all_one)}
    if level < cfg.egr_fail:
        if easy:
            return Item(name, Mark.WARN, f"{said}, {all_one:.0%} of groups all-correct: the data is too easy", details)
        return Item(name, Mark.FAIL, f"{said}, below {cfg.egr_fail:g}: most groups teach nothing", details)
    if level < cfg.egr_warn:
        return Item(name, Mark.WARN, f"{said}, below {cfg.egr_warn:g}", details)
    return Item(name, Mark.PASS, said, details)


def length_item(h: RunHistory, checks: ChecksConfig, cfg: ChecklistConfig) -> Item:
    name = "response_length"
    series = h.signal(Signal.LENGTH_MEAN)
    base = baseline(series, checks.baseline)
    level = end_level(series, cfg.level_steps)
    if base is None or base <= 0 or level is None:
        return Item(name, Mark.WARN, "the run logs no response length (or too few steps for its baseline)")
    ratio = level / base
    said = f"mean response length {level:.4g} at the end, {ratio:.2f}× its baseline {base:.4g}"
    details = {"level": _r(level), "baseline": _r(base), "ratio": _r(ratio)}
    if ratio < cfg.length_fail_ratio:
        return Item(name, Mark.FAIL, f"{said}: collapsed", details)
    if ratio < cfg.length_warn_ratio:
        return Item(name, Mark.WARN, f"{said}: shrinking", details)
    if ratio > cfg.length_growth_warn:
        return Item(name, Mark.WARN, f"{said}: growing (read the samples for padding or loops)", details)
    return Item(name, Mark.PASS, said, details)


def truncation_item(h: RunHistory, cfg: ChecklistConfig) -> Item:
    name = "truncation"
    level = end_level(h.signal(Signal.TRUNCATION), cfg.level_steps)
    if level is None:
        return Item(name, Mark.WARN, "unmeasured: the run logs no response_length/clip_ratio")
    said = f"{level:.0%} of responses cut at the length cap at the end"
    details = {"share": _r(level)}
    if level > cfg.truncation_fail:
        return Item(name, Mark.FAIL, f"{said}, above {cfg.truncation_fail:.0%}", details)
    if level > cfg.truncation_warn:
        return Item(name, Mark.WARN, f"{said}, above {cfg.truncation_warn:.0%}", details)
    return Item(name, Mark.PASS, said, details)


def incidents_item(rows: Sequence[IncidentRow]) -> Item:
    """How the run's incidents ended: one still open at critical or given up fails; open at warn or unproven
    (UNRESOLVED) warns; resolved, dismissed and closed by hand (``guardian incidents close``, named) pass."""
    name = "incidents"
    told = [
        {
            "incident_id": r.incident.id,
            "check": r.incident.check,
            "final_state": r.final_state,
            "outcome": r.outcome_line,
        }
        for r in rows
    ]
    details = {"incidents": told}

    def each(pick: Callable[[IncidentRow], bool]) -> list[str]:
        return [f"#{r.incident.id} {r.incident.check}" for r in rows if pick(r)]

    open_critical = each(lambda r: r.incident.is_open and r.incident.severity >= Severity.CRITICAL)
    gave_up = each(lambda r: r.incident.status == IncidentStatus.GAVE_UP)
    if open_critical or gave_up:
        parts = ([f"open at critical: {', '.join(open_critical)}"] if open_critical else []) + (
            [f"given up: {', '.join(gave_up)}"] if gave_up else []
        )
        return Item(name, Mark.FAIL, "; ".join(parts), details)
    open_warn = each(lambda r: r.incident.is_open)
    unproven = each(lambda r: r.incident.status == IncidentStatus.UNRESOLVED or r.final_state == State.UNRESOLVED)
    if open_warn or unproven:
        parts = ([f"open: {', '.join(open_warn)}"] if open_warn else []) + (
            [f"rescue unproven, a person must look: {', '.join(unproven)}"] if unproven else []
        )
        return Item(name, Mark.WARN, "; ".join(parts), details)
    if not rows:
        return Item(name, Mark.PASS, "no incidents", details)
    by_hand = each(lambda r: r.incident.status == IncidentStatus.CLOSED)
    if by_hand:
        reason = f"{len(rows)} incident(s), each resolved, dismissed or closed; closed by hand: {', '.join(by_hand)}"
        return Item(name, Mark.PASS, reason, details)
    return Item(name, Mark.PASS, f"{len(rows)} incident(s), each resolved or dismissed", details)


def checkpoints_item(facts: RunFacts, cfg: ChecklistConfig) -> Item:
    name = "checkpoints"
    kept = [c for c in facts.checkpoints if c.verdict == Verdict.HEALTHY and c.path in facts.present]
    details = {"healthy": [{"step": c.step, "path": c.path} for c in kept]}
    if not facts.checkpoints and facts.run.checkpoints_dir is None:
        return Item(
            name, Mark.WARN, "no checkpoint folder known for the run (guardian watch --checkpoints DIR)", details
        )
    if len(kept) < cfg.min_healthy_checkpoints:
        reason = f"{len(kept)} healthy checkpoint(s) kept, {cfg.min_healthy_checkpoints} needed to launch from"
        return Item(name, Mark.FAIL, reason, details)
    if not kept:
        return Item(name, Mark.PASS, "no healthy checkpoint kept (checklist.min_healthy_checkpoints is 0)", details)
    newest = kept[-1]
    return Item(
        name, Mark.PASS, f"{len(kept)} healthy checkpoint(s) kept, newest step {newest.step} ({newest.path})", details
    )


def samples_item(facts: RunFacts) -> Item:
    """Always a warning: the best-scored samples are for a person to read (a reward can be gamed)."""
    name = "samples"
    review = facts.samples
    details: dict[str, object] = {
        "samples": [s.to_json() for s in review.samples],
        "steps_read": list(review.steps_read),
        "problems": list(review.problems),
    }
    if not review.samples:
        where = f"looked in {', '.join(facts.rollout_folders)}" if facts.rollout_folders else "no folder known"
        fix = "set trainer.rollout_data_dir (guardian watch: --rollouts DIR)"
        return Item(name, Mark.WARN, f"no scored rollout dumps found ({where}): {fix}", details)
    steps = (
        f"{review.steps_read[0]}-{review.steps_read[-1]}" if len(review.steps_read) > 1 else str(review.steps_read[0])
    )
    return Item(
        name, Mark.WARN, f"read these: the {len(review.samples)} highest-reward samples of steps {steps}", details
    )


def evaluation_items(evaluations: Sequence[EvaluationView], cfg: ChecklistConfig) -> list[Item]:
    """One item per evaluation recorded or required (``checklist.eval_minimums``)."""
    recorded = {e.name: e for e in evaluations}
    names = sorted(set(recorded) | set(cfg.eval_minimums))
    if not names:
        return [Item("evaluations", Mark.WARN, "no evaluation results recorded: pass --eval NAME=VALUE")]
    items = []
    for name in names:
        result, minimum = recorded.get(name), cfg.eval_minimums.get(name)
        details = {
            "value": result.value if result else None,
            "minimum": minimum,
            "step": result.step if result else None,
        }
        label = f"eval:{name}"
        if result is None:
            items.append(Item(label, Mark.FAIL, f"required (minimum {minimum:g}) and not recorded", details))
        elif minimum is None:
            reason = f"{result.value:g} recorded; no minimum set (checklist.eval_minimums.{name})"
            items.append(Item(label, Mark.WARN, reason, details))
        elif result.value < minimum:
            items.append(Item(label, Mark.FAIL, f"{result.value:g}, below its minimum {minimum:g}", details))
        else:
            items.append(Item(label, Mark.PASS, f"{result.value:g}, at least its minimum {minimum:g}", details))
    return items


def judge(facts: RunFacts, checks: ChecksConfig, cfg: ChecklistConfig) -> Checklist:
    """The checklist of a run."""
    h = facts.history
    reward, converged = reward_item(h, checks)
    items = [
        reward,
        entropy_item(h, checks, cfg, converged),
        kl_item(h, cfg),
        egr_item(h, checks, cfg),
        length_item(h, checks, cfg),
        truncation_item(h, cfg),
        incidents_item(facts.incidents),
        checkpoints_item(facts, cfg),
        samples_item(facts),
        *evaluation_items(facts.evaluations, cfg),
    ]
    return Checklist(facts.run.id, h.last_step, tuple(items))
