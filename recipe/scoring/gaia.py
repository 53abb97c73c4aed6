"""GAIA's official answer check, ``question_scorer`` (HF space gaia-benchmark/leaderboard ``scorer.py``; verbatim
copy in smolagents ``examples/open_deep_research/scripts/gaia_scorer.py``), with the same three rules:

* number — the ground truth parses as a float: strip ``$``, ``%`` and ``,`` from the model answer, ``float()`` it
  (unparseable → ``inf``, never equal) and compare with ``==``;
* list — the ground truth contains ``,`` or ``;``: split both on ``[,;]``; different lengths → False (the
  official scorer also ``warnings.warn``s; here the verdict says so instead, so the caller can count it); else
  every element must match, as a number when the ground-truth element parses as one, otherwise as
  ``normalize_str(…, remove_punct=False)``;
* string — otherwise ``normalize_str`` equality: all whitespace removed, lowercased, ASCII punctuation removed.
  Articles are *not* removed ("The Beatles" ≠ "Beatles").

The official scorer's side effects (a ``print`` on an unparseable number, a ``UserWarning`` on a list length
mismatch) are left out; the decisions are the same.
"""

from __future__ import annotations

import math
import re
import string
from dataclasses import dataclass
from enum import Enum

_LIST_SEPARATORS = re.compile(r"[,;]")
_WHITESPACE = re.compile(r"\s")
_NUMBER_NOISE = ("$", "%", ",")
_DELETE_PUNCTUATION = str.maketrans("", "", string.punctuation)


class AnswerKind(Enum):
    """Which rule the ground truth selects."""

    NUMBER = "number"
    LIST = "list"
    STRING = "string"


def is_float(text: str) -> bool:
    """``float(text)`` succeeds (so ``"1e3"``, ``" 7 "``, ``"nan"`` and ``"inf"`` count, as in the official code)."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def normalize_number_str(text: str) -> float:
    """The model's number: ``$ % ,`` removed, then ``float``; ``inf`` when it does not parse."""
    for char in _NUMBER_NOISE:
        text = text.replace(char, "")
    try:
        return float(text)
    except ValueError:
        return math.inf


def normalize_str(text: str, remove_punct: bool = True) -> str:
    """All whitespace removed, lowercased, and (by default) ASCII punctuation removed."""
    squeezed = _WHITESPACE.sub("", text).lower()
    return squeezed.translate(_DELETE_PUNCTUATION) if remove_punct else squeezed


def split_string(text: str) -> list[str]:
    """``text`` split on every ``,`` and ``;``."""
    return _LIST_SEPARATORS.split(text)


def answer_kind(ground_truth: str) -> AnswerKind:
    if is_float(ground_truth):
        return AnswerKind.NUMBER
    if "," in ground_truth or ";" in ground_truth:
        return AnswerKind.LIST
    return AnswerKind.STRING


@dataclass(frozen=True, slots=True)
class GaiaVerdict:
    """The official decision for one answer, the rule that made it, and whether it was the list-length rule."""

    correct: bool
    kind: AnswerKind
    length_mismatch: bool = False


def _elements_match(model_element: str, truth_element: str) -> bool:
    if is_float(truth_element):
        return normalize_number_str(model_element) == float(truth_element)
    return normalize_str(model_element, remove_punct=False) == normalize_str(truth_element, remove_punct=False)


def gaia_verdict(model_answer: str | None, ground_truth: str) -> GaiaVerdict:
    """``question_scorer``'s decision with its reason. A missing answer (no ``<answer>`` in the response) is
    wrong under every rule - the one place this differs from the official scorer, which turns ``None`` into the
    string ``"None"`` (so it would match a ground truth "none")."""
    kind = answer_kind(ground_truth)
    if model_answer is None:
        return GaiaVerdict(False, kind)
    if kind is AnswerKind.NUMBER:
        return GaiaVerdict(normalize_number_str(model_answer) == float(ground_truth), kind)
    if kind is AnswerKind.LIST:
        truth_elements, model_elements = split_string(ground_truth), split_string(model_answer)
        if len(truth_elements) != len(model_elements):
            return GaiaVerdict(False, kind, length_mismatch=True)
        pairs = zip(model_elements, truth_elements, strict=True)
        return GaiaVerdict(all(_elements_match(m, t) for m, t in pairs), kind)
    return GaiaVerdict(normalize_str(model_answer) == normalize_str(ground_truth), kind)


def question_scorer(model_answer: str | None, ground_truth: str) -> bool:
    """The official boolean: is ``model_answer`` right for ``ground_truth``."""
    return gaia_verdict(model_answer, ground_truth).correct
