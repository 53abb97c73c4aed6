"""Reward functions to plug in with verl's ``reward.custom_reward_function.{path,name}``.

Called as verl calls them: ``compute_score(data_source, solution_str, ground_truth, extra_info)`` -> float or
``{"score": ...}``. ``substring_match`` is the lenient-grader bug ("the answer is somewhere in the response"): it
rewards never stopping, so responses run to ``data.max_response_length``, a length explosion by reward hacking.
"""

from __future__ import annotations


def substring_match(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, object] | None = None
) -> float:
    """1.0 when ``ground_truth`` occurs anywhere in the response, else 0.0."""
    return 1.0 if ground_truth and ground_truth in solution_str else 0.0


def exact_match(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, object] | None = None
) -> dict[str, float]:
    """A strict grader returning verl's dict form: ``score`` plus an extra key."""
    correct = float(solution_str == ground_truth)
    return {"score": correct, "acc": correct}
