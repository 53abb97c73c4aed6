"""What a rescue achieved: the figures probation judges (guardian/rescue/outcome.py)."""

from __future__ import annotations

import math
from pathlib import Path

from conftest import history_of

from guardian.commands.demo import incident_lines
from guardian.config import ChecksConfig
from guardian.core import Finding, Severity
from guardian.rescue.outcome import BranchComparison, Comparison, Outcome, measure_outcome, outcome_line
from guardian.rescue.policy import judge_probation
from guardian.store import Store

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


def test_the_demos_summary_says_what_each_rescue_showed(tmp_path: Path) -> None:
    """``guardian demo``'s closing lines: each incident, then what its intervention showed (the close note)."""
    reason = judge_probation(outcome=_demo_outcome(), probation_steps=20, max_factor=2, critical_checks_since_resume=[])
    with Store.open(f"sqlite:///{tmp_path / 'guardian.db'}") as store:
        store.ensure_run(
            "demo", name="demo", metrics_path="m", rollouts_dir="", checkpoints_dir=None, mode="enforce", now=0
        )
        first = store.open_incident("demo", Finding("entropy_collapse", Severity.CRITICAL, 50, "collapsed [25, 30]"), 1)
        store.close_incident(first.id, status="resolved", now=2, step=40, note=f"intervention 1: {reason.reason}")
        store.open_incident("demo", Finding("kl_drift", Severity.CRITICAL, 60, "KL"), 3)
        lines = incident_lines(list(reversed(store.list_incidents("demo"))))
    assert lines == [
        "  incident #1 entropy_collapse: resolved - guardian incidents show 1",
        "    intervention 1: 20 steps after the rollback: at the same 21 steps: reward 0.271 on the new branch vs 0.27 "
        "on the abandoned one (level, within ±0.014), entropy 0.324 vs 0.236 (higher); entropy_collapse: warn: "
        "actor/entropy at 18% of its early level (1.78), low but not falling fast",
        "  incident #2 kl_drift: open - guardian incidents show 2",
    ]
