"""The intervention state machine and its decisions."""

from __future__ import annotations

import pytest

from guardian.rescue.outcome import BranchComparison, Comparison, Outcome
from guardian.rescue.policy import (
    Ending,
    Kind,
    PastIntervention,
    State,
    TransitionError,
    check_transition,
    judge_probation,
    plan_intervention,
)


def test_happy_path_transitions_are_allowed_and_finished_states_are_final() -> None:
    path = [State.DETECTED, State.STOPPING, State.STOPPED, State.ROLLED_BACK, State.PATCHED, State.RESUMING]
    for a, b in zip(path, [*path[1:], State.PROBATION], strict=True):
        check_transition(a, b)
    check_transition(State.PROBATION, State.RESOLVED)
    with pytest.raises(TransitionError, match="RESOLVED -> STOPPING; allowed from RESOLVED: none"):
        check_transition(State.RESOLVED, State.STOPPING)
    with pytest.raises(TransitionError, match="allowed from DETECTED: GAVE_UP, STOPPING"):
        check_transition(State.DETECTED, State.PATCHED)


def test_first_intervention_is_rung_one() -> None:
    plan = plan_intervention(
        incident_id=1, check="entropy_collapse", kind=Kind.REMEDIATE, past=[], budget=3, ladder_length=3
    )
    assert not plan.give_up and plan.rung == 0 and plan.exclude_steps == frozenset()


def test_relapse_climbs_a_rung_and_goes_further_back() -> None:
    past = [PastIntervention(1, "entropy_collapse", Kind.REMEDIATE, 0, State.RELAPSED, 40)]
    plan = plan_intervention(
        incident_id=1, check="entropy_collapse", kind=Kind.REMEDIATE, past=past, budget=3, ladder_length=3
    )
    assert plan.rung == 1 and plan.exclude_steps == {40}
    past.append(PastIntervention(1, "entropy_collapse", Kind.REMEDIATE, 1, State.RELAPSED, 30))
    plan = plan_intervention(
        incident_id=1, check="entropy_collapse", kind=Kind.REMEDIATE, past=past, budget=5, ladder_length=2
    )
    assert plan.rung == 1  # the last rung repeats
    assert plan.exclude_steps == {30, 40}


def test_budget_spent_gives_up_and_kinds_have_separate_budgets() -> None:
    past = [PastIntervention(i, "kl_drift", Kind.REMEDIATE, 0, State.RESOLVED, 10) for i in range(3)]
    assert plan_intervention(
        incident_id=9, check="kl_drift", kind=Kind.REMEDIATE, past=past, budget=3, ladder_length=3
    ).give_up
    assert not plan_intervention(
        incident_id=9, check="kl_drift", kind=Kind.RESTART, past=past, budget=3, ladder_length=1
    ).give_up


def outcome(steps_after: int, *, healthy: bool = True, reward: tuple[float, float] | None = (0.5, 0.5)) -> Outcome:
    """Figures of a rescue rolled back to step 40: ``reward`` is (at the rollback point, now)."""
    compared = None if reward is None else Comparison("critic/score/mean", reward[0], reward[1], 0.02)
    return Outcome(40, 40 + steps_after, steps_after, "entropy_collapse", healthy, "ok", compared, None)


def test_probation_resolves_only_a_proven_fix() -> None:
    assert judge_probation(
        outcome=outcome(5), probation_steps=10, max_factor=2.0, critical_checks_since_resume=[]
    ).ending is (Ending.ON_PROBATION)
    passed = judge_probation(outcome=outcome(10), probation_steps=10, max_factor=2.0, critical_checks_since_resume=[])
    assert passed.ending is Ending.RESOLVED
    said = "10 steps after the rollback: reward 0.5 vs 0.5 at the rollback point (level, within ±0.02)"
    assert passed.reason == f"{said}; entropy_collapse: ok"
    relapsed = judge_probation(
        outcome=outcome(4), probation_steps=10, max_factor=2.0, critical_checks_since_resume=["entropy_collapse"]
    )
    assert relapsed.ending is Ending.RELAPSED and "entropy_collapse" in relapsed.reason


def test_a_quiet_fix_that_lost_the_reward_is_unresolved_not_resolved() -> None:
    # nothing critical for the whole window, the signal healthy, but the reward ended below the rollback point
    short = outcome(10, reward=(0.86, 0.3))
    assert judge_probation(
        outcome=short, probation_steps=10, max_factor=2.0, critical_checks_since_resume=[]
    ).ending is (Ending.ON_PROBATION)  # waits, up to twice the window, for the reward to come back
    over = judge_probation(
        outcome=outcome(20, reward=(0.86, 0.3)), probation_steps=10, max_factor=2.0, critical_checks_since_resume=[]
    )
    assert over.ending is Ending.UNRESOLVED and "reward 0.3 vs 0.86 at the rollback point (lower)" in over.reason
    back = judge_probation(
        outcome=outcome(14, reward=(0.86, 0.85)), probation_steps=10, max_factor=2.0, critical_checks_since_resume=[]
    )
    assert back.ending is Ending.RESOLVED  # within the noise tolerance of the rollback point


def test_trouble_that_persists_relapses_to_the_next_rung() -> None:
    stuck = outcome(20, healthy=False, reward=(0.5, 0.3))
    verdict = judge_probation(outcome=stuck, probation_steps=10, max_factor=2.0, critical_checks_since_resume=[])
    assert verdict.ending is Ending.RELAPSED and "persists" in verdict.reason
    # the signal still warns but the reward came back: not proven, not worse - a person looks
    mixed = judge_probation(
        outcome=outcome(20, healthy=False), probation_steps=10, max_factor=2.0, critical_checks_since_resume=[]
    )
    assert mixed.ending is Ending.UNRESOLVED


def test_a_trainer_that_finishes_during_probation_is_judged_on_what_it_showed() -> None:
    done = judge_probation(outcome=outcome(3, reward=None), probation_steps=10, max_factor=2.0,
                           critical_checks_since_resume=[], trainer_finished=True)  # fmt: skip
    assert done.ending is Ending.RESOLVED  # signal healthy, reward not yet comparable
    short = judge_probation(outcome=outcome(6, reward=(0.5, 0.2)), probation_steps=10, max_factor=2.0,
                            critical_checks_since_resume=[], trainer_finished=True)  # fmt: skip
    assert short.ending is Ending.UNRESOLVED and "the trainer finished" in short.reason


def test_the_same_trouble_coming_back_after_a_fix_gets_a_stronger_rung() -> None:
    past = [PastIntervention(1, "kl_drift", Kind.REMEDIATE, 0, State.RESOLVED, 10)]
    plan = plan_intervention(incident_id=2, check="kl_drift", kind=Kind.REMEDIATE, past=past, budget=3, ladder_length=3)
    assert plan.rung == 1 and plan.exclude_steps == frozenset()  # a new incident: no checkpoint excluded
    other = plan_intervention(incident_id=2, check="nan", kind=Kind.REMEDIATE, past=past, budget=3, ladder_length=3)
    assert other.rung == 0


def test_a_resolved_probation_says_what_was_shown_not_that_the_fix_is_proven() -> None:
    """The demo's rescue (issue 25): both branches at the same reward, the entropy higher on the new one."""
    level = BranchComparison("critic/score/mean", 21, 0.271, 0.27, 0.0138, True)
    entropy = BranchComparison("actor/entropy", 21, 0.324, 0.236, 0.0118, True)
    figures = Outcome(20, 40, 20, "entropy_collapse", False, "warn: low", None, None, level, entropy)
    verdict = judge_probation(outcome=figures, probation_steps=20, max_factor=2.0, critical_checks_since_resume=[])
    assert verdict.ending is Ending.RESOLVED and "proven" not in verdict.reason
    assert verdict.reason == (
        "20 steps after the rollback: at the same 21 steps: reward 0.271 on the new branch vs 0.27 on the abandoned "
        "one (level, within ±0.014), entropy 0.324 vs 0.236 (higher); entropy_collapse: warn: low"
    )
