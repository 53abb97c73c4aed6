"""The search protocol's text rules and the one turn loop (recipe.agent.protocol, recipe.agent.episode), driven by a
scripted model and a scripted retriever: every way an episode can end, and what the model is shown."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from recipe.agent.episode import Ending, EpisodeLimits, Turn, TurnEnd, run_episode
from recipe.agent.protocol import (
    INVALID_SEARCH_NOTE,
    STOP_STRINGS,
    Answer,
    NoAction,
    Search,
    cut_at_stop,
    format_observation,
    parse_action,
    stop_end,
)
from recipe.reward import compute_score
from recipe.search.passage import Passage, RetrievalError, split_contents

PARIS = Passage("17", "Paris", "Paris is the capital and most populous city of France.", 12.5)
LYON = Passage("18", "Lyon", "Lyon is the third-largest city of France.", 9.0)


class ScriptedModel:
    """A Transcript whose model writes the scripted turns in order; it records what the environment appended."""

    def __init__(self, turns: Sequence[tuple[str, TurnEnd]], budget_chars: int = 100_000) -> None:
        self.script = list(turns)
        self.budget_chars = budget_chars
        self.text = ""
        self.observations: list[str] = []
        self.stops_asked: list[tuple[str, ...]] = []

    async def generate(self, stop: Sequence[str]) -> Turn:
        self.stops_asked.append(tuple(stop))
        text, end = self.script.pop(0)
        text = cut_at_stop(text)
        self.text += text
        return Turn(text, end)

    def observe(self, text: str) -> bool:
        if len(self.text) + len(text) > self.budget_chars:
            return False
        self.text += text
        self.observations.append(text)
        return True


class ScriptedRetriever:
    def __init__(self, hits: Sequence[Passage] = (PARIS, LYON), fail: bool = False) -> None:
        self.hits = list(hits)
        self.fail = fail
        self.calls: list[tuple[list[str], int]] = []

    async def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        self.calls.append((list(queries), topk))
        if self.fail:
            raise RetrievalError("http://127.0.0.1:1/retrieve: connection refused after 3 attempts")
        return [self.hits[:topk] for _ in queries]


def run(model: ScriptedModel, retriever: ScriptedRetriever, **limits: int) -> object:
    ticks = iter(range(1000))
    return asyncio.run(run_episode(model, retriever, EpisodeLimits(**limits), clock=lambda: float(next(ticks))))


# --- protocol ------------------------------------------------------------------------------------------------------


def test_a_turn_is_cut_after_the_first_stop_string() -> None:
    assert cut_at_stop("<search>a</search> and more<answer>x</answer>") == "<search>a</search>"
    assert cut_at_stop("<answer>x</answer></search>") == "<answer>x</answer>"
    assert cut_at_stop("no stop here") == "no stop here"
    assert stop_end("ab</search>") == len("ab</search>")
    assert stop_end("nothing") is None
    assert set(STOP_STRINGS) == {"</search>", "</answer>"}


@pytest.mark.parametrize(
    ("turn", "action"),
    [
        ("<think>need it</think><search> capital  of\nFrance </search>", Search("capital of France")),
        ("<think>ok</think><answer> Paris </answer>", Answer(" Paris ")),
        ("<answer></answer>", Answer("")),
        ("<search>first</search> trailing text after the engine's stop", Search("first")),
        ("<search>   </search>", NoAction()),
        ("</search>", NoAction()),
        ("I think the answer is Paris.", NoAction()),
        ("<search>unclosed query", NoAction()),
        ("<search>a<search>b</search>", Search("b")),
    ],
)
def test_the_action_is_read_from_the_end_of_the_turn(turn: str, action: object) -> None:
    assert parse_action(turn) == action


def test_an_observation_lists_the_passages_in_search_r1_layout() -> None:
    block = format_observation([PARIS, LYON], max_chars=3000)
    assert block == (
        "\n\n<result>\n"
        "Doc 1 (Title: Paris) Paris is the capital and most populous city of France.\n"
        "Doc 2 (Title: Lyon) Lyon is the third-largest city of France.\n"
        "</result>\n\n"
    )


def test_an_observation_never_exceeds_its_cap_and_always_closes() -> None:
    long = Passage("1", "Long", "word " * 2000, 1.0)
    for cap in (40, 100, 700, 3000):
        block = format_observation([long, PARIS, LYON], max_chars=cap)
        assert len(block) <= cap
        assert block.startswith("\n\n<result>\n") and block.endswith("</result>\n\n")
    assert "Doc 2" not in format_observation([long, PARIS], max_chars=700)
    assert format_observation([long], max_chars=700).rstrip().removesuffix("</result>").rstrip().endswith("…")


def test_no_passages_give_an_empty_block_that_the_reward_counts_as_a_failed_call() -> None:
    block = format_observation([], max_chars=3000)
    assert block == "\n\n<result>\n</result>\n\n"
    response = f"<search>q</search>{block}<answer>x</answer>"
    assert compute_score("hotpotqa", response, {"target": ["x"]})["call_success"] == 0.0


def test_a_cap_too_small_for_the_tags_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="max_result_chars=10"):
        format_observation([PARIS], max_chars=10)


def test_wiki18_contents_split_into_title_and_text() -> None:
    assert split_contents('"Evan Morris"\nEvan L. Morris was a lobbyist.') == (
        "Evan Morris",
        "Evan L. Morris was a lobbyist.",
    )
    assert split_contents("no title line") == ("", "no title line")


# --- the loop ------------------------------------------------------------------------------------------------------


def test_search_then_answer_scores_full_marks() -> None:
    model = ScriptedModel(
        [
            ("<think>I need the capital.</think><search>capital of France</search>", TurnEnd.STOP),
            ("<think>It is Paris.</think><answer>Paris</answer>", TurnEnd.STOP),
        ]
    )
    retriever = ScriptedRetriever()
    episode = run(model, retriever, topk=2)
    assert episode.ending is Ending.ANSWERED and episode.answer == "Paris"
    assert episode.turns == 2 and episode.queries == ["capital of France"] and episode.failed_searches == 0
    assert retriever.calls == [(["capital of France"], 2)]
    assert model.stops_asked == [STOP_STRINGS, STOP_STRINGS]
    assert episode.search_seconds == 1.0
    score = compute_score("hotpotqa", model.text, {"target": ["Paris"]})
    assert score == {
        "score": 1.0,
        "correctness": 1.0,
        "format": 1.0,
        "length_penalty": 1.0,
        "n_calls": 1,
        "call_success": 1.0,
    }


def test_the_last_turn_cannot_search() -> None:
    model = ScriptedModel([(f"<search>q{i}</search>", TurnEnd.STOP) for i in range(3)])
    retriever = ScriptedRetriever()
    episode = run(model, retriever, max_turns=3)
    assert episode.ending is Ending.TURNS and episode.answer is None
    assert episode.turns == 3 and episode.queries == ["q0", "q1"] and len(retriever.calls) == 2
    assert len(model.observations) == 2


def test_a_failed_search_shows_an_empty_result_and_the_episode_goes_on() -> None:
    model = ScriptedModel([("<search>q</search>", TurnEnd.STOP), ("<answer>Paris</answer>", TurnEnd.STOP)])
    episode = run(model, ScriptedRetriever(fail=True))
    assert episode.ending is Ending.ANSWERED and episode.failed_searches == 1
    assert model.observations == ["\n\n<result>\n</result>\n\n"]
    assert "connection refused" in episode.errors[0]


def test_ending_the_message_without_an_answer_stops_the_episode() -> None:
    episode = run(ScriptedModel([("I do not know.", TurnEnd.EOS)]), ScriptedRetriever())
    assert episode.ending is Ending.STOPPED and episode.turns == 1 and episode.answer is None


def test_a_turn_without_a_usable_query_is_told_so_and_may_try_again() -> None:
    model = ScriptedModel([("<search> </search>", TurnEnd.STOP), ("<answer>Paris</answer>", TurnEnd.STOP)])
    retriever = ScriptedRetriever()
    episode = run(model, retriever)
    assert episode.ending is Ending.ANSWERED and episode.invalid_turns == 1 and retriever.calls == []
    assert INVALID_SEARCH_NOTE in model.observations[0]


def test_the_response_budget_ends_the_episode() -> None:
    cut_off = run(ScriptedModel([("<think>long reasoning that never", TurnEnd.LENGTH)]), ScriptedRetriever())
    assert cut_off.ending is Ending.LENGTH
    no_room = ScriptedModel([("<search>q</search>", TurnEnd.STOP)], budget_chars=30)
    assert run(no_room, ScriptedRetriever()).ending is Ending.LENGTH
    assert no_room.observations == []


def test_an_answer_counts_even_when_the_budget_ran_out_on_it() -> None:
    episode = run(ScriptedModel([("<answer>Paris</answer>", TurnEnd.LENGTH)]), ScriptedRetriever())
    assert episode.ending is Ending.ANSWERED and episode.answer == "Paris"


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="max_turns and topk"):
        EpisodeLimits(max_turns=0)
