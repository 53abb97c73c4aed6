"""Reward for the search agent: exact match of the final answer, plus small format and brevity terms.

verl 0.9.1 calls :func:`compute_score` as its custom reward function (``reward.custom_reward_function.path`` =
this file, ``name`` = ``compute_score``) once per response, and logs every key of the returned dict as a metric.

The agent's protocol::

    <think>…</think>            reasoning
    <search>query</search>      a retrieval call; the environment appends <result>…</result> to the response
    <answer>…</answer>          the final answer

The score (all terms in [0, 1])::

    score = 0.7 × correctness + 0.1 × format + 0.2 × length_penalty × correctness

* correctness — 1.0 when the last ``<answer>…</answer>`` equals any ground-truth alias after SQuAD normalisation,
  else 0.0. This is Search-R1's exact-match (EM) outcome reward (Jin et al. 2025, "Search-R1", ``qa_em.py``),
  with the answer normaliser of the SQuAD v1.1 evaluation script (Rajpurkar et al. 2016): lowercase, drop
  punctuation, drop the articles a/an/the, collapse whitespace. Here it is made Unicode-aware: NFKC first (so
  full-width letters and composed/decomposed accents compare equal), casefold, and every Unicode punctuation
  character is dropped besides ASCII's. ``<result>…</result>`` blocks are removed before the answer is looked
  for: retrieved documents may contain the literal text ``<answer>``, and that is not the model's answer.
* format — 1.0 when the response is well formed (see :func:`is_well_formed`), else 0.0.
* length_penalty — a credit factor, 1.0 = no penalty, that shrinks in tiers as the model's own text (the response
  without its ``<result>`` blocks, whose length the retriever decides) grows; see ``LENGTH_PENALTY_TIERS``. It
  only scales the bonus of a correct answer, so a long wrong answer is not pushed further down.

Diagnostics returned beside the score: ``n_calls`` (``<search>`` calls) and ``call_success`` (share of calls
answered by a non-empty ``<result>``; 0.0 without calls).

Every scan here is linear in the response (no regex that can backtrack over the whole text, see
:func:`read_transcript`): a 1 MB response is scored in well under a second.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from recipe.prompt import ANSWER_CLOSE, ANSWER_OPEN, RESULT_CLOSE, RESULT_OPEN, SEARCH_OPEN

# --- constants --------------------------------------------------------------------------------------------------

CORRECTNESS_WEIGHT = 0.7
FORMAT_WEIGHT = 0.1
LENGTH_BONUS_WEIGHT = 0.2  # multiplied by length_penalty × correctness

# (characters of the model's own text strictly above which the factor applies, factor). The factor of the
# LARGEST threshold exceeded wins, whatever the order written here (the seed tutorial checked ``> 4000`` before
# ``> 8000``, so its ``> 8000`` tier never ran). At or below the smallest threshold: full credit, 1.0.
# 4000 characters is about 1000 tokens: room for several think/search rounds; past 8000 the answer is rambling.
LENGTH_PENALTY_TIERS: tuple[tuple[int, float], ...] = ((4000, 0.5), (8000, 0.0))
FULL_LENGTH_CREDIT = 1.0

PROTOCOL_TAGS = ("think", "search", "result", "answer")
# end-of-turn markers a response may still carry when decoded with its special tokens; allowed after </answer>
END_OF_TURN_MARKERS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>")
# where Search-R1 / verl datasets keep the answer aliases when the ground truth is a dict
GROUND_TRUTH_KEYS = ("target", "answer", "answers", "ground_truth")


_TAG = re.compile(r"</?(?:" + "|".join(PROTOCOL_TAGS) + r")>")
_RESULT_BLOCK = re.compile(re.escape(RESULT_OPEN) + r"(.*?)" + re.escape(RESULT_CLOSE), re.DOTALL)
_ARTICLES = re.compile(r"\b(?:a|an|the)\b")


# --- reading a response -------------------------------------------------------------------------------------------


class Transcript(NamedTuple):
    """A response taken apart. ``<result>`` content is opaque (retrieved documents may hold tag-like text such as
    ``<answer>``): a block runs from ``<result>`` to the next ``</result>``, or to the end when never closed."""

    model_text: str  # the response without its result blocks (tags included): what the model wrote
    skeleton: str  # the response with each result's content removed: "<result></result>" (a final "<result>" if cut)
    results: list[str]  # the content of each result block, in order
    tags: list[str]  # the protocol tags of the skeleton, in order, e.g. ["<search>", "</search>", "<result>", ...]


def read_transcript(text: str) -> Transcript:
    """Split ``text`` into what the model wrote and what the environment returned. Linear: the block regex runs
    only up to the last ``</result>``, where every ``<result>`` has a closing tag after it, so no match attempt
    fails after a long scan; an unclosed block after that is found with ``str.find``."""
    last_closing = text.rfind(RESULT_CLOSE)
    split_at = 0 if last_closing < 0 else last_closing + len(RESULT_CLOSE)
    pieces = _RESULT_BLOCK.split(text[:split_at])  # [model text, result content, model text, …, model text]
    model_pieces, results = pieces[0::2], pieces[1::2]
    tail = text[split_at:]
    unclosed = tail.find(RESULT_OPEN)
    if unclosed < 0:
        model_pieces[-1] += tail
        skeleton = (RESULT_OPEN + RESULT_CLOSE).join(model_pieces)
    else:  # cut off by the response length: the rest of the response is its content
        model_pieces[-1] += tail[:unclosed]
        results.append(tail[unclosed + len(RESULT_OPEN) :])
        skeleton = (RESULT_OPEN + RESULT_CLOSE).join(model_pieces) + RESULT_OPEN
    return Transcript("".join(model_pieces), skeleton, results, _TAG.findall(skeleton))


def last_answer(model_text: str) -> str | None:
    """The content of the last complete ``<answer>…</answer>`` of ``model_text`` (results already removed), or
    None. With ``<answer>a<answer>b</answer>`` the answer is ``b``: the opening tag nearest the last closing."""
    closing = model_text.rfind(ANSWER_CLOSE)
    if closing < 0:
        return None
    opening = model_text.rfind(ANSWER_OPEN, 0, closing)
    if opening < 0:
        return None
    return model_text[opening + len(ANSWER_OPEN) : closing]


# --- format -----------------------------------------------------------------------------------------------------


def tags_are_flat_and_balanced(tags: list[str]) -> bool:
    """Every opening tag is closed by its own closing tag before any other protocol tag appears (no nesting, no
    stray or unclosed tags): the sequence is ``<x> </x> <y> </y> …``."""
    openings, closings = tags[0::2], tags[1::2]
    return (
        len(openings) == len(closings)
        and all(not opening.startswith("</") for opening in openings)
        and all(closing == "</" + opening[1:] for opening, closing in zip(openings, closings, strict=True))
    )


def only_end_of_turn_after(text: str, position: int) -> bool:
    """Nothing but whitespace (and end-of-turn markers) in ``text`` from ``position`` on."""
    rest = text[position:]
    for marker in END_OF_TURN_MARKERS:
        rest = rest.replace(marker, "")
    return not rest.strip()


def is_well_formed(transcript: Transcript) -> bool:
    """The response is well formed when all of these hold:

    1. its protocol tags (think/search/result/answer, outside ``<result>`` content) are balanced and flat: each
       ``<x>`` is closed by ``</x>`` before another tag opens, with no stray closing tag and none left open (a
       result cut off by the length limit is left open);
    2. it holds exactly one ``<answer>…</answer>`` block, and that block's content is not blank;
    3. the answer is the end: after its ``</answer>`` comes only whitespace (or an end-of-turn marker such as
       ``<|im_end|>``) — no further search, think or text.

    Text between blocks (outside any tag) is tolerated: chat templates leave role names around tool turns.
    """
    tags = transcript.tags
    if not tags_are_flat_and_balanced(tags) or tags.count(ANSWER_OPEN) != 1 or tags[-1] != ANSWER_CLOSE:
        return False
    answer = last_answer(transcript.model_text)
    if answer is None or not answer.strip():
        return False
    skeleton = transcript.skeleton
    return only_end_of_turn_after(skeleton, skeleton.rfind(ANSWER_CLOSE) + len(ANSWER_CLOSE))


# --- search calls -----------------------------------------------------------------------------------------------


def search_call_counts(transcript: Transcript) -> tuple[int, int]:
    """(calls, successful calls). A call is a ``<search>`` tag outside result content; it succeeded when the
    first ``<result>`` after it, before the next ``<search>``, has non-blank content (a result cut off by the
    response length counts by what it holds)."""
    calls = successes = 0
    awaiting_result = False
    result_contents = iter(transcript.results)
    for tag in transcript.tags:
        if tag == SEARCH_OPEN:
            calls += 1
            awaiting_result = True
        elif tag == RESULT_OPEN:
            content = next(result_contents, "")
            if awaiting_result and content.strip():
                successes += 1
            awaiting_result = False
    return calls, successes


# --- correctness ------------------------------------------------------------------------------------------------


class _PunctuationDeleter(dict[int, int | None]):
    """A ``str.translate`` table that deletes ASCII and Unicode punctuation (categories P*), built lazily: each
    code point is classified once, on first sight, instead of all 1.1 million at import."""

    def __missing__(self, codepoint: int) -> int | None:
        char = chr(codepoint)
        is_punctuation = char in string.punctuation or unicodedata.category(char).startswith("P")
        replacement = None if is_punctuation else codepoint
        self[codepoint] = replacement
        return replacement


_DELETE_PUNCTUATION = _PunctuationDeleter()


def normalize_answer(text: str) -> str:
    """SQuAD v1.1 answer normalisation, Unicode-aware: NFKC, casefold, drop punctuation, drop a/an/the, collapse
    whitespace."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = text.translate(_DELETE_PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def answer_aliases(ground_truth: object) -> list[str]:
    """Every accepted answer in ``ground_truth``: a string; a number (its ``str``); a mapping whose
    ``GROUND_TRUTH_KEYS`` hold aliases (Search-R1 stores ``{"target": [...]}``); or any other iterable of those
    (a list, a tuple, the numpy array verl reads from parquet), flattened. Anything else is a TypeError: a reward
    that is silently always 0 would hide a broken dataset."""
    if isinstance(ground_truth, str):
        return [ground_truth]
    if isinstance(ground_truth, int | float) and not isinstance(ground_truth, bool):
        return [str(ground_truth)]
    if isinstance(ground_truth, Mapping):
        present = [key for key in GROUND_TRUTH_KEYS if key in ground_truth]
        if not present:
            raise TypeError(f"ground truth dict has none of the keys {GROUND_TRUTH_KEYS}: {sorted(ground_truth)}")
        return [alias for key in present for alias in answer_aliases(ground_truth[key])]
    if isinstance(ground_truth, Iterable) and not isinstance(ground_truth, bytes | bytearray):
        return [alias for item in ground_truth for alias in answer_aliases(item)]
    raise TypeError(f"unsupported ground truth {type(ground_truth).__name__}: {ground_truth!r}")


def exact_match(prediction: str | None, aliases: Iterable[str]) -> bool:
    """The normalised prediction equals a normalised alias; an empty normalised string never matches (an
    answer of just ``"the"`` is not right, and an empty alias accepts nothing)."""
    if prediction is None:
        return False
    normalized = normalize_answer(prediction)
    return bool(normalized) and any(normalized == normalize_answer(alias) for alias in aliases)


# --- length -----------------------------------------------------------------------------------------------------


def length_penalty(n_chars: int) -> float:
    """The factor of the largest ``LENGTH_PENALTY_TIERS`` threshold that ``n_chars`` exceeds, else 1.0."""
    factor = FULL_LENGTH_CREDIT
    for threshold, tier_factor in sorted(LENGTH_PENALTY_TIERS):
        if n_chars > threshold:
            factor = tier_factor
    return factor


# --- verl entry point -------------------------------------------------------------------------------------------


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: object,
    extra_info: object = None,
    **kwargs: object,
) -> dict[str, float | int]:
    """verl's custom reward function: the score of one decoded response (tool results included) against the
    ground truth of its row. ``data_source``, ``extra_info`` and extra keyword arguments are accepted and unused:
    every dataset of the recipe is scored the same way. Returns ``score``, ``correctness``, ``format``,
    ``length_penalty``, ``n_calls`` and ``call_success``, all numeric (verl logs each as a metric)."""
    transcript = read_transcript(solution_str)
    correctness = 1.0 if exact_match(last_answer(transcript.model_text), answer_aliases(ground_truth)) else 0.0
    well_formed = 1.0 if is_well_formed(transcript) else 0.0
    length_factor = length_penalty(len(transcript.model_text))
    calls, successes = search_call_counts(transcript)
    score = (
        CORRECTNESS_WEIGHT * correctness
        + FORMAT_WEIGHT * well_formed
        + LENGTH_BONUS_WEIGHT * length_factor * correctness
    )
    return {
        "score": score,
        "correctness": correctness,
        "format": well_formed,
        "length_penalty": length_factor,
        "n_calls": calls,
        "call_success": successes / calls if calls else 0.0,
    }
