"""The intervention state machine and its decisions."""

from __future__ import annotations

import pytest

from guardian.policy import (
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


def test_probation() -> None:
    assert judge_probation(target_step=40, newest_step=45, probation_steps=10, critical_checks_since_resume=[]) == (
        judge_probation(target_step=40, newest_step=49, probation_steps=10, critical_checks_since_resume=[])
    )
    passed = judge_probation(target_step=40, newest_step=50, probation_steps=10, critical_checks_since_resume=[])
    assert passed.done and not passed.relapsed
    relapsed = judge_probation(
        target_step=40, newest_step=44, probation_steps=10, critical_checks_since_resume=["entropy_collapse"]
    )
    assert relapsed.done and relapsed.relapsed and "entropy_collapse" in relapsed.reason


def test_the_same_trouble_coming_back_after_a_fix_gets_a_stronger_rung() -> None:
    past = [PastIntervention(1, "kl_drift", Kind.REMEDIATE, 0, State.RESOLVED, 10)]
    plan = plan_intervention(incident_id=2, check="kl_drift", kind=Kind.REMEDIATE, past=past, budget=3, ladder_length=3)
    assert plan.rung == 1 and plan.exclude_steps == frozenset()  # a new incident: no checkpoint excluded
    other = plan_intervention(incident_id=2, check="nan", kind=Kind.REMEDIATE, past=past, budget=3, ladder_length=3)
    assert other.rung == 0


def test_probation_waits_while_the_incidents_check_still_warns() -> None:
    waiting = judge_probation(
        target_step=40, newest_step=55, probation_steps=10, critical_checks_since_resume=[], still_warning=True
    )
    assert not waiting.done
    over = judge_probation(
        target_step=40, newest_step=60, probation_steps=10, critical_checks_since_resume=[], still_warning=True
    )
    assert over.done and not over.relapsed and "still warns" in over.reason
