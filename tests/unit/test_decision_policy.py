"""The decision policy (guardian/checks/policy.py): the table, the run's progress, 'not enough data', and a
rescue judged against the branch it replaced."""

from __future__ import annotations

import pytest
from conftest import history_of

from guardian.checks import build_checks
from guardian.checks.policy import (
    ROLES,
    TABLE,
    Progress,
    ProgressReading,
    Role,
    Shape,
    decide,
    read_progress,
    too_little_to_judge,
)
from guardian.config import ChecksConfig
from guardian.core import Finding, Severity, StepRecord
from guardian.history.timeline import RunHistory
from guardian.rescue.outcome import measure_outcome, outcome_line
from guardian.rescue.policy import Ending, judge_probation

C = ChecksConfig()
R, KL = "critic/score/mean", "actor/kl_loss"
SCORE_RANGE = {"critic/score/max": 1.0, "critic/score/min": 0.0}


def progress_of(h: RunHistory) -> ProgressReading:
    return read_progress(h, C.policy, C.reward_collapse, C.baseline)


def test_every_check_has_a_role_and_every_cell_a_severity() -> None:
    assert {c.name for c in build_checks(C)} <= set(ROLES)
    for role in Role:
        for shape in (Shape.OUT_OF_BAND, Shape.FAILURE, Shape.FAST, Shape.HARD):
            assert set(TABLE[role][shape]) == set(Progress), (role, shape)
    # the corners the policy exists for
    assert TABLE[Role.MECHANISM][Shape.FAILURE][Progress.IMPROVING] == "advice"
    assert TABLE[Role.MECHANISM][Shape.FAILURE][Progress.STALLED] == Severity.CRITICAL
    assert TABLE[Role.MECHANISM][Shape.HARD][Progress.IMPROVING] == Severity.CRITICAL
    assert all(cell != Severity.CRITICAL for cell in TABLE[Role.ADVISORY][Shape.HARD].values())


@pytest.mark.parametrize(
    ("progress", "severity", "advice"),
    [
        (Progress.IMPROVING, Severity.WARN, True),
        (Progress.HOLDING, Severity.WARN, True),
        (Progress.SLOWING, Severity.WARN, False),
        (Progress.STALLED, Severity.CRITICAL, False),
        (Progress.FALLING, Severity.CRITICAL, False),
        (Progress.YOUNG, Severity.WARN, False),
        (Progress.UNMEASURED, Severity.CRITICAL, False),
    ],
)
def test_a_mechanism_in_its_failure_shape_is_weighed_against_the_progress(
    progress: Progress, severity: Severity, advice: bool
) -> None:
    kl = Finding("kl_drift", Severity.CRITICAL, 20, "actor/kl_loss grew 2.5x in 10 steps", 12, {"kl": 0.4})
    decided = decide(kl, ProgressReading(progress, "why"))
    assert (decided.severity, decided.advice) == (severity, advice)
    assert decided.evidence["progress"] == progress.value and decided.evidence["kl"] == 0.4
    if severity < Severity.CRITICAL:
        assert decided.message.endswith("a warning, not a rollback: why")


def test_a_grad_spike_never_rolls_back_and_a_hard_failure_always_does() -> None:
    spike = Finding("grad_spike", Severity.CRITICAL, 9, "grad norm 40x", 8)
    assert decide(spike, ProgressReading(Progress.FALLING, "why")).severity == Severity.WARN
    dead = Finding("entropy_collapse", Severity.CRITICAL, 12, "dead", 9, {"hard": True})
    assert decide(dead, ProgressReading(Progress.IMPROVING, "why")).severity == Severity.CRITICAL


def test_a_sharp_fall_is_read_before_the_trend_has_points_and_three_points_act_alone() -> None:
    rewards = [0.9, 0.85, 0.95, 0.9]
    h = history_of([{R: r, **SCORE_RANGE} for r in [*rewards, 0.1]])
    assert progress_of(h).progress is Progress.YOUNG  # one low point is noise
    h = history_of([{R: r, **SCORE_RANGE} for r in [*rewards, 0.1, 0.05]])
    reading = progress_of(h)
    assert reading.progress is Progress.FALLING and reading.since == 5 and not reading.hard
    h = history_of([{R: r, **SCORE_RANGE} for r in [*rewards, 0.1, 0.05, 0.0]])
    reading = progress_of(h)
    assert reading.progress is Progress.COLLAPSED and reading.hard


def test_one_slow_step_after_steady_learning_does_not_turn_a_warning_into_a_rollback() -> None:
    # the reward learned for 30 steps; the newest point reads 'stalled' alone: the step before still learned
    h = RunHistory()
    for step, r in enumerate([0.1 + 0.02 * i for i in range(30)], 1):
        h.add(StepRecord(step, {R: r, **SCORE_RANGE}))
    assert progress_of(h).progress is Progress.IMPROVING


def test_too_little_to_judge_names_what_is_missing() -> None:
    assert too_little_to_judge(40, ["entropy", "reward"], C.policy) is None
    assert too_little_to_judge(40, ["val_score"], C.policy) is None
    assert too_little_to_judge(4, ["reward"], C.policy) == "not enough data: 4 steps (the checks need 10)"
    assert too_little_to_judge(40, ["entropy"], C.policy) == "not enough data: 40 steps, no reward signal"


def _branches(new_kl: list[float], new_reward: list[float]) -> RunHistory:
    """Steps 1-10 learning, an abandoned branch 11-20 whose KL runs away while its reward stalls, and a new
    branch resumed from step 10."""
    h = RunHistory()
    for step in range(1, 11):
        h.add(StepRecord(step, {KL: 0.01 * step, R: 0.03 * step, **SCORE_RANGE}))
    for step in range(11, 21):
        h.add(StepRecord(step, {KL: 0.1 * 1.4 ** (step - 10), R: 0.3, **SCORE_RANGE}))
    for offset, (kl, reward) in enumerate(zip(new_kl, new_reward, strict=True)):
        h.add(StepRecord(11 + offset, {KL: kl, R: reward, **SCORE_RANGE}))
    return h


def test_a_rescue_whose_kl_keeps_growing_slower_than_the_abandoned_branch_is_resolved() -> None:
    # KL grows on the new branch too (every run that learns from its reference does), far slower than before
    h = _branches([0.1 * 1.15**i for i in range(1, 11)], [0.3 + 0.02 * i for i in range(1, 11)])
    own = Finding("kl_drift", Severity.CRITICAL, 20, "actor/kl_loss grew 2x", 11)  # as if still out of band
    outcome = measure_outcome(h, target_step=10, own=own, own_check="kl_drift", checks=C)
    assert outcome.signal_vs_abandoned is not None and outcome.signal_vs_abandoned.at_least_as_good
    assert outcome.reward_vs_abandoned is not None and outcome.reward_vs_abandoned.at_least_as_good
    assert outcome.reward_vs_abandoned.steps == 10 and not outcome.signal_healthy and outcome.proven
    verdict = judge_probation(outcome=outcome, probation_steps=10, max_factor=2, critical_checks_since_resume=[])
    assert verdict.ending is Ending.RESOLVED
    assert "at the same 10 steps: reward 0.41 on the new branch vs 0.3 on the abandoned one (higher)" in verdict.reason
    # as `guardian incidents show` and the report print the stored figures
    line = outcome_line(outcome.to_json())
    assert "at the same 10 steps: reward 0.41 on the new branch vs 0.3 on the abandoned one (higher)" in line


def test_a_rescue_that_learns_less_than_the_abandoned_branch_is_not_proven() -> None:
    h = _branches([0.1] * 10, [0.1] * 10)
    outcome = measure_outcome(h, target_step=10, own=None, own_check="kl_drift", checks=C)
    assert outcome.reward_vs_abandoned is not None and not outcome.reward_vs_abandoned.at_least_as_good
    assert not outcome.proven
    document = outcome.to_json()
    assert document["reward_vs_abandoned"]["at_least_as_good"] is False  # type: ignore[index]


def test_the_resumes_first_line_at_the_rollback_step_is_not_compared() -> None:
    # verl's first line after a resume is at the rollback step itself (validation before training): the checkpoint's
    h = _branches([0.1 * 1.15**i for i in range(1, 11)], [0.3 + 0.02 * i for i in range(1, 11)])
    h.add(StepRecord(10, {KL: 0.1, R: 0.3, **SCORE_RANGE}))  # a second resume from step 10, as verl writes it
    for step in range(11, 16):
        h.add(StepRecord(step, {KL: 0.1, R: 0.5, **SCORE_RANGE}))
    outcome = measure_outcome(h, target_step=10, own=None, own_check="kl_drift", checks=C)
    assert outcome.reward_vs_abandoned is not None and outcome.reward_vs_abandoned.steps == 5
