"""HotpotQA's answer metrics, exactly as the official ``hotpot_evaluate_v1.py`` computes them (hotpotqa/hotpot
@4c0fa5e: ``normalize_answer``, ``exact_match_score``, ``f1_score``), plus the best over gold aliases as
2WikiMultihopQA's ``2wikimultihop_evaluate_v1.1.py`` takes it.

``normalize_answer``: lowercase, drop ASCII punctuation, replace the words a/an/the by a space, collapse
whitespace — in that order, and ASCII-only (``str.lower`` and ``string.punctuation``, as the script does).
EM is equality of the normalised strings. F1 is bag-of-tokens F1 of the normalised strings, except that it is 0
whenever either side normalises to ``yes``, ``no`` or ``noanswer`` and the two differ.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)
SPECIAL_ANSWERS = frozenset({"yes", "no", "noanswer"})


def normalize_answer(text: str) -> str:
    """``hotpot_evaluate_v1.normalize_answer``: white_space_fix(remove_articles(remove_punc(lower(text))))."""
    lowered = text.lower()
    no_punctuation = "".join(ch for ch in lowered if ch not in _PUNCTUATION)
    no_articles = _ARTICLES.sub(" ", no_punctuation)
    return " ".join(no_articles.split())


def exact_match_score(prediction: str, ground_truth: str) -> bool:
    """The normalised strings are equal."""
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def f1_score(prediction: str, ground_truth: str) -> tuple[float, float, float]:
    """(f1, precision, recall) over the normalised tokens; all 0 when a side is yes/no/noanswer and they differ,
    or when no token is shared."""
    pred, gold = normalize_answer(prediction), normalize_answer(ground_truth)
    if (pred in SPECIAL_ANSWERS or gold in SPECIAL_ANSWERS) and pred != gold:
        return 0.0, 0.0, 0.0
    pred_tokens, gold_tokens = pred.split(), gold.split()
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0, 0.0, 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall


@dataclass(frozen=True, slots=True)
class AnswerScore:
    """EM (0 or 1) and F1 of one prediction."""

    em: float
    f1: float


def best_score(prediction: str | None, aliases: Iterable[str]) -> AnswerScore:
    """The highest EM and the highest F1 of ``prediction`` over the gold ``aliases`` (each maximised on its own,
    as the 2Wiki script does); a missing prediction, or no aliases, scores 0 (the official script counts a
    missing answer as 0 in the mean)."""
    if prediction is None:
        return AnswerScore(0.0, 0.0)
    golds = list(aliases)
    em = max((1.0 if exact_match_score(prediction, gold) else 0.0 for gold in golds), default=0.0)
    f1 = max((f1_score(prediction, gold)[0] for gold in golds), default=0.0)
    return AnswerScore(em, f1)
