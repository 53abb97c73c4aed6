"""Official answer scorers for evaluating the search agent: HotpotQA's answer EM/F1 (``hotpot``), GAIA's
``question_scorer`` (``gaia``), and reading the model's final answer out of a response (``answer``).

Pure functions, no I/O. These are the benchmarks' own rules, which differ from the training reward's
(``recipe.reward``: Unicode-aware SQuAD normalisation, empty answers never match): scores reported here are
comparable with published numbers, the reward is not meant to be.
"""

from recipe.scoring.answer import extract_answer
from recipe.scoring.gaia import GaiaVerdict, gaia_verdict, question_scorer
from recipe.scoring.hotpot import AnswerScore, best_score, exact_match_score, f1_score, normalize_answer

__all__ = [
    "AnswerScore",
    "GaiaVerdict",
    "best_score",
    "exact_match_score",
    "extract_answer",
    "f1_score",
    "gaia_verdict",
    "normalize_answer",
    "question_scorer",
]
