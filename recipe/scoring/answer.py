"""The model's final answer in a response: the content of its last ``<answer>…</answer>``, read exactly as the
training reward reads it (``recipe.reward``): ``<result>`` blocks are removed first, since retrieved passages may
contain the literal text ``<answer>``."""

from __future__ import annotations

from recipe.reward import last_answer, read_transcript


def extract_answer(response: str) -> str | None:
    """The last complete ``<answer>…</answer>`` the model wrote in ``response``, or None (scored as wrong)."""
    return last_answer(read_transcript(response).model_text)
