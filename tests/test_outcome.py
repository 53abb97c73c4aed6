"""What a rescue achieved: the figures probation judges (guardian/rescue/outcome.py)."""

from __future__ import annotations

import math

from conftest import history_of

from guardian.config import ChecksConfig
from guardian.rescue.outcome import measure_outcome

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
