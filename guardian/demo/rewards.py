"""Reward functions to plug in with verl's ``reward.custom_reward_function.{path,name}``.

verl calls ``compute_score(data_source, solution_str, ground_truth, extra_info)`` with the response
decoded without special tokens and takes a float, or a dict with a ``"score"`` key. The demo loads
these the same way (from a file path), so a scenario can swap the grader like a verl user would.

``substring_match`` is the classic lenient-grader bug: "is the answer *somewhere* in the response"
instead of "is the response the answer". A longer response contains more substrings, so the policy
learns to stop emitting EOS and its responses run to ``data.max_response_length``: a real length
explosion, driven by reward hacking.
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
