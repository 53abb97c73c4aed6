"""Rule reward of the copy-digit task, in verl's custom reward function form.

verl loads this file by path (``reward.custom_reward_function.path=<tiny>/tiny_reward.py``,
``reward.custom_reward_function.name=compute_score``); ``gpu.tiny`` copies it beside the data. Standard library only.

Score in [0, 1] over the first ``WINDOW`` characters of the answer: 0.5 × the share of digits + 0.5 × the share of
the target digit. A prompt ``copy 7`` is answered best by ``77777777``.
"""

from __future__ import annotations

from typing import Any

WINDOW = 8


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None, **kwargs: Any
) -> float:
    if len(ground_truth) != 1 or not ground_truth.isdigit():
        raise ValueError(f"tiny_reward: ground truth must be one digit, got {ground_truth!r} ({data_source})")
    window = solution_str[:WINDOW]
    digits = sum(ch.isdigit() for ch in window)
    target = sum(ch == ground_truth for ch in window)
    return 0.5 * digits / WINDOW + 0.5 * target / WINDOW
