"""One search episode: the turn loop of the protocol, shared by training (verl's agent loop) and evaluation (an
OpenAI-compatible endpoint).

The loop knows nothing of tokens or HTTP. A :class:`Transcript` continues the conversation and keeps what was
written: the verl backend keeps token ids and a loss mask, the evaluation backend keeps text. A :class:`Searcher`
answers queries. Both are awaited, so episodes of one batch run concurrently on one event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from recipe.agent.protocol import (
    STOP_STRINGS,
    Answer,
    NoAction,
    Search,
    format_observation,
    invalid_search_observation,
    parse_action,
)
from recipe.search.passage import Passage, RetrievalError


class TurnEnd(Enum):
    """Why a generation stopped."""

    STOP = "stop"  # on a stop string
    EOS = "eos"  # the model ended its message
    LENGTH = "length"  # the response budget ran out


@dataclass(frozen=True, slots=True)
class Turn:
    """One generation: the text the model wrote (cut at the first stop string) and why it stopped."""

    text: str
    end: TurnEnd


class Transcript(Protocol):
    """The conversation so far, continued by a model."""

    async def generate(self, stop: Sequence[str]) -> Turn:
        """Let the model continue; keep its text as model-written (cut after the first of ``stop``)."""
        ...

    def observe(self, text: str) -> bool:
        """Append environment text (never trained on). False when the response budget cannot hold it: the
        transcript then ends as it was."""
        ...


class Searcher(Protocol):
    """A retriever: one list of passages per query, best first. Raises :class:`RetrievalError` on failure."""

    async def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]: ...


class Ending(Enum):
    """How an episode ended."""

    ANSWERED = "answered"  # an <answer> was given
    STOPPED = "stopped"  # the model ended its message without an answer
    LENGTH = "length"  # the response budget ran out
    TURNS = "turns"  # max_turns generations without an answer


@dataclass(frozen=True, slots=True)
class EpisodeLimits:
    """``max_turns`` model generations (the last one cannot search); ``topk`` passages per search; each
    observation at most ``max_result_chars`` characters."""

    max_turns: int = 8
    topk: int = 3
    max_result_chars: int = 3000

    def __post_init__(self) -> None:
        if self.max_turns < 1 or self.topk < 1:
            raise ValueError(f"max_turns and topk must be at least 1, got {self.max_turns} and {self.topk}")


@dataclass(slots=True)
class Episode:
    """What happened in one episode (the transcript holds the text itself)."""

    ending: Ending = Ending.TURNS
    answer: str | None = None
    turns: int = 0
    queries: list[str] = field(default_factory=list)
    failed_searches: int = 0
    invalid_turns: int = 0
    search_seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def searches(self) -> int:
        return len(self.queries)


async def run_episode(
    transcript: Transcript,
    searcher: Searcher,
    limits: EpisodeLimits,
    clock: Callable[[], float] = time.monotonic,
) -> Episode:
    """Generate, act on each turn's ``<search>``, write the results back, until an answer, the end of the model's
    message, the response budget or ``limits.max_turns``. A failed search shows the model an empty result (and is
    counted); it does not end the episode."""
    episode = Episode()
    for turn_number in range(1, limits.max_turns + 1):
        turn = await transcript.generate(STOP_STRINGS)
        episode.turns = turn_number
        action = parse_action(turn.text)
        if isinstance(action, Answer):
            episode.ending, episode.answer = Ending.ANSWERED, action.text
            return episode
        if turn.end is TurnEnd.LENGTH:
            episode.ending = Ending.LENGTH
            return episode
        if turn.end is TurnEnd.EOS and isinstance(action, NoAction):
            episode.ending = Ending.STOPPED
            return episode
        if turn_number == limits.max_turns:
            break
        if isinstance(action, Search):
            observation = await _search(searcher, action.query, limits, episode, clock)
        else:
            episode.invalid_turns += 1
            observation = invalid_search_observation()
        if not transcript.observe(observation):
            episode.ending = Ending.LENGTH
            return episode
    episode.ending = Ending.TURNS
    return episode


async def _search(
    searcher: Searcher, query: str, limits: EpisodeLimits, episode: Episode, clock: Callable[[], float]
) -> str:
    episode.queries.append(query)
    started = clock()
    try:
        passages = (await searcher.search([query], limits.topk))[0]
    except RetrievalError as error:
        episode.failed_searches += 1
        episode.errors.append(str(error))
        passages = []
    finally:
        episode.search_seconds += clock() - started
    return format_observation(passages, limits.max_result_chars)
