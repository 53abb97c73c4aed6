"""The search protocol's text rules, as pure functions: where a model turn ends, what it asked for, and the text the
environment writes back.

A model turn ends at the first ``</search>`` or ``</answer>`` (the stop strings). A turn ending in
``<search>query</search>`` asks the retriever; the answer comes back as an observation::

    \\n\\n<result>\\nDoc 1 (Title: Paris) Paris is the capital …\\nDoc 2 (Title: …) …\\n</result>\\n\\n

which the training loop masks from the loss (the model did not write it). A turn ending in ``<answer>…</answer>``
ends the episode. Passage lines are ``Doc i (Title: t) text``: Search-R1's layout (``_passages2string`` writes
``Doc i(Title: t)``, without the space) as verl's former search tool spells it, one line per passage, with the
``<result>`` tag of this recipe in place of Search-R1's ``<information>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from recipe.prompt import ANSWER_CLOSE, ANSWER_OPEN, RESULT_CLOSE, RESULT_OPEN, SEARCH_CLOSE, SEARCH_OPEN
from recipe.search.passage import Passage

STOP_STRINGS: tuple[str, ...] = (SEARCH_CLOSE, ANSWER_CLOSE)

OBSERVATION_OPEN = f"\n\n{RESULT_OPEN}\n"
OBSERVATION_CLOSE = f"{RESULT_CLOSE}\n\n"
# shown (masked) when a turn ended on a stop string but carried no usable query, e.g. "<search> </search>"
INVALID_SEARCH_NOTE = (
    "No search was made: write one query as <search>query</search>, "
    "or give the final answer as <answer>answer</answer>."
)
TRUNCATION_MARK = " …"


@dataclass(frozen=True, slots=True)
class Search:
    """The turn asked the retriever for ``query`` (stripped, never empty)."""

    query: str


@dataclass(frozen=True, slots=True)
class Answer:
    """The turn gave the final answer ``text`` (as written, between the answer tags)."""

    text: str


@dataclass(frozen=True, slots=True)
class NoAction:
    """The turn carried neither a usable query nor an answer."""


Action = Search | Answer | NoAction


def stop_end(text: str) -> int | None:
    """The index just past the first stop string in ``text``, or None when there is none."""
    ends = [found + len(stop) for stop in STOP_STRINGS if (found := text.find(stop)) >= 0]
    return min(ends) if ends else None


def cut_at_stop(text: str) -> str:
    """``text`` up to and including its first stop string (engines may run a few characters past it)."""
    end = stop_end(text)
    return text if end is None else text[:end]


def _last_tagged(text: str, opening: str, closing: str) -> str | None:
    if not text.endswith(closing):
        return None
    start = text.rfind(opening, 0, len(text) - len(closing))
    return None if start < 0 else text[start + len(opening) : len(text) - len(closing)]


def parse_action(turn_text: str) -> Action:
    """What a model turn asked for. Only a turn that *ends* with a stop string acts (the engine stops there): the
    content of the last opening tag before it is the query or the answer."""
    turn = cut_at_stop(turn_text).rstrip()
    answer = _last_tagged(turn, ANSWER_OPEN, ANSWER_CLOSE)
    if answer is not None:
        return Answer(answer)
    query = _last_tagged(turn, SEARCH_OPEN, SEARCH_CLOSE)
    if query is not None and query.strip():
        return Search(" ".join(query.split()))
    return NoAction()


def _passage_line(rank: int, passage: Passage) -> str:
    return f"Doc {rank} (Title: {passage.title}) {passage.text}\n"


def _wrap(body: str) -> str:
    return f"{OBSERVATION_OPEN}{body}{OBSERVATION_CLOSE}"


def format_passages(passages: Sequence[Passage], max_chars: int) -> str:
    """The passage lines for ``passages`` (``Doc i (Title: t) text``, one per line), at most ``max_chars`` characters.
    Passages are cut from the end, the last one kept marked ``…``; no passages give the empty string. The native tool
    (``recipe.agent.search_tool``) returns this as it is; :func:`format_observation` wraps it in ``<result>``."""
    if max_chars <= 0:
        raise ValueError(f"max_chars={max_chars} leaves no room for passages")
    body = ""
    for rank, passage in enumerate(passages, start=1):
        line = _passage_line(rank, passage)
        if len(body) + len(line) <= max_chars:
            body += line
            continue
        cut = max_chars - len(body) - len(TRUNCATION_MARK) - 1
        if cut > 0:
            body += line[:cut].rstrip() + TRUNCATION_MARK + "\n"
        break
    return body


def format_observation(passages: Sequence[Passage], max_chars: int) -> str:
    """The ``<result>`` block for ``passages``, at most ``max_chars`` characters in all (tags included: the block
    always closes). Passages are cut from the end, the last one kept marked ``…``; no passages give an empty
    block, which the reward counts as a failed call."""
    room = max_chars - len(_wrap(""))
    if room <= 0:
        raise ValueError(f"max_result_chars={max_chars} leaves no room inside {RESULT_OPEN}…{RESULT_CLOSE}")
    return _wrap(format_passages(passages, room))


def invalid_search_observation() -> str:
    """The block written back after a turn that stopped without a usable query."""
    return _wrap(INVALID_SEARCH_NOTE + "\n")
