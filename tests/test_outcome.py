"""What a rescue achieved: the figures probation judges (guardian/rescue/outcome.py)."""

from __future__ import annotations

import math

from conftest import history_of

from guardian.config import ChecksConfig
from guardian.rescue.outcome import BranchComparison, Comparison, Outcome, measure_outcome, outcome_line

VAL, ENTROPY = "val-core/x/acc/mean@1", "actor/entropy"


def test_a_young_validation_score_is_judged_within_recovery_tolerance() -> None:
    # validation every 10 steps: too few scores for their own noise, so the tolerance is a share of the level
    scores = {10: 0.5, 20: 0.5, 30: 0.43}
    history = history_of([{VAL: scores[step]} if step in scores else {ENTROPY: 1.0} for step in range(1, 31)])
    default = measure_outcome(history, target_step=20, own=None, own_check=None, checks=ChecksConfig())
    assert default.validation is not None
    assert math.isclose(default.validation.tolerance, 0.05 * 0.5) and not default.validation.recovered
    looser = ChecksConfig.model_validate({"reward_collapse": {"recovery_tolerance": 0.2}})
    wider = measure_outcome(history, target_step=20, own=None, own_check=None, checks=looser).validation
    assert wider is not None and math.isclose(wider.tolerance, 0.2 * 0.5) and wider.recovered


def _demo_outcome() -> Outcome:
    """The demo's rescue as it resolved (issue 25): 20 steps after the rollback both branches sit at the same
    reward, the entropy is higher on the new branch and its own check still warns."""
    return Outcome(
        target_step=20,
        newest_step=40,
        steps_after=20,
        signal_check="entropy_collapse",
        signal_healthy=False,
        signal_message="warn: actor/entropy at 18% of its early level (1.78), low but not falling fast",
        reward=Comparison("critic/score/mean", 0.2, 0.299, 0.035),
        validation=None,
        reward_vs_abandoned=BranchComparison("critic/score/mean", 21, 0.271, 0.27, 0.0138, True),
        signal_vs_abandoned=BranchComparison("actor/entropy", 21, 0.324, 0.236, 0.0118, True),
    )


def test_the_figures_say_in_plain_words_what_the_new_branch_showed() -> None:
    outcome = _demo_outcome()
    assert outcome.proven
    assert outcome.describe() == (
        "at the same 21 steps: reward 0.271 on the new branch vs 0.27 on the abandoned one (level, within ±0.014), "
        "entropy 0.324 vs 0.236 (higher); "
        "entropy_collapse: warn: actor/entropy at 18% of its early level (1.78), low but not falling fast"
    )
    # as `guardian incidents show` and the report print the stored figures
    assert outcome_line(outcome.to_json()) == (
        "critic/score/mean 0.2 -> 0.299 (x1.50, back); at the same 21 steps: reward 0.271 on the new branch vs "
        "0.27 on the abandoned one (level, within ±0.014), entropy 0.324 vs 0.236 (higher); signal: warn: "
        "actor/entropy at 18% of its early level (1.78), low but not falling fast; 20 steps after the rollback"
    )


def test_figures_without_an_abandoned_branch_compare_with_the_rollback_point() -> None:
    lower = Outcome(40, 50, 10, None, True, "ok", Comparison("critic/score/mean", 0.86, 0.3, 0.02), None)
    assert lower.describe() == "reward 0.3 vs 0.86 at the rollback point (lower)"
    validation = Comparison("val-core/x/acc/mean@1", 0.5, 0.49, 0.025)
    level = Outcome(40, 50, 10, "kl_drift", True, "ok", None, validation)
    assert level.describe() == "validation score 0.49 vs 0.5 at the rollback point (level, within ±0.025); kl_drift: ok"
    # KL lower on the new branch is better; counted over different steps, each says its own
    kl = Outcome(
        10,
        20,
        10,
        "kl_drift",
        False,
        "critical: KL grew",
        None,
        None,
        BranchComparison("critic/score/mean", 10, 0.41, 0.3, 0.02, True),
        BranchComparison("actor/kl_loss", 9, 0.2, 0.5, 0.03, False),
    )
    assert kl.describe().startswith(
        "at the same steps: reward 0.41 on the new branch vs 0.3 on the abandoned one over 10 steps (higher), "
        "KL 0.2 vs 0.5 over 9 steps (lower); kl_drift: critical: KL grew"
    )
    assert Outcome(1, None, 0, None, True, "no finding yet", None, None).describe() == "no figures yet"
