"""recipe.reward: the search agent's EM reward (correctness, format, length tiers, search-call diagnostics)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

from recipe.reward import (
    LENGTH_PENALTY_TIERS,
    answer_aliases,
    compute_score,
    is_well_formed,
    last_answer,
    length_penalty,
    normalize_answer,
    read_transcript,
)

WELL_FORMED = (
    "<think>Who directed it?</think><search>director of Jaws</search>"
    "<result>Doc 1: Jaws is a 1975 film directed by Steven Spielberg.</result>"
    "<think>Found it.</think><answer>Steven Spielberg</answer>"
)
KEYS = {"score", "correctness", "format", "length_penalty", "n_calls", "call_success"}


def score(solution: str, ground_truth: object = "Steven Spielberg") -> dict[str, float | int]:
    return compute_score("hotpotqa", solution, ground_truth)


# --- the whole reward -------------------------------------------------------------------------------------------


def test_well_formed_correct_response_scores_one() -> None:
    result = score(WELL_FORMED)
    assert set(result) == KEYS
    assert result == {
        "score": pytest.approx(1.0),
        "correctness": 1.0,
        "format": 1.0,
        "length_penalty": 1.0,
        "n_calls": 1,
        "call_success": 1.0,
    }


def test_every_value_is_a_plain_number() -> None:
    for value in score(WELL_FORMED).values():
        assert type(value) in (int, float)


@pytest.mark.parametrize(
    ("solution", "ground_truth", "expected"),
    [
        (WELL_FORMED, "Steven Spielberg", 1.0),  # all terms
        (WELL_FORMED, "George Lucas", 0.1),  # well formed, wrong: format only
        ("Steven Spielberg", "Steven Spielberg", 0.0),  # no answer tag: nothing
        ("<answer>Steven Spielberg</answer> trailing", "Steven Spielberg", 0.9),  # right, badly formed
        ("<answer>x" + "y" * 5000 + "</answer>", "x" + "y" * 5000, 0.7 + 0.1 + 0.2 * 0.5),  # right, long
    ],
)
def test_score_weights(solution: str, ground_truth: str, expected: float) -> None:
    assert score(solution, ground_truth)["score"] == pytest.approx(expected)


def test_extra_arguments_are_accepted() -> None:
    result = compute_score("nq", "<answer>Paris</answer>", "Paris", extra_info={"index": 3}, tokenizer=None)
    assert result["correctness"] == 1.0


# --- correctness ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "solution", ["", "   ", "no tags at all", "<answer>unclosed", "</answer>", "<answer></answer>"]
)
def test_no_answer_is_incorrect(solution: str) -> None:
    result = score(solution, ["", "unclosed"])
    assert result["correctness"] == 0.0
    assert result["score"] == 0.0


def test_last_answer_counts() -> None:
    solution = "<answer>George Lucas</answer><answer>Steven Spielberg</answer>"
    assert score(solution)["correctness"] == 1.0
    assert score(solution, "George Lucas")["correctness"] == 0.0


def test_nearest_opening_tag_to_the_last_closing_one() -> None:
    assert last_answer("<answer>a <answer>b</answer>") == "b"
    assert last_answer("<answer>a</answer> <answer>b") == "a"


@pytest.mark.parametrize(
    ("prediction", "truth"),
    [
        ("the Beatles", "Beatles"),
        ("Beatles.", "The Beatles"),
        ("  an   Apple  ", "apple"),
        ("U.S.A.", "usa"),
        ("Rock 'n' Roll!", "rock n roll"),
        ("A Tale of Two Cities", "tale of two cities"),
        ("JOHN SMITH", "john smith"),
    ],
)
def test_punctuation_articles_case_and_spaces_do_not_matter(prediction: str, truth: str) -> None:
    assert score(f"<answer>{prediction}</answer>", truth)["correctness"] == 1.0


@pytest.mark.parametrize(
    ("prediction", "truth"),
    [
        ("Theater", "the ater"),  # "the" inside a word is no article
        ("Beatles", "Rolling Stones"),
        ("Paris France", "Paris"),  # EM, not containment
        ("1984", "1985"),
    ],
)
def test_different_answers_do_not_match(prediction: str, truth: str) -> None:
    assert score(f"<answer>{prediction}</answer>", truth)["correctness"] == 0.0


@pytest.mark.parametrize(
    ("prediction", "truth"),
    [
        ("François Truffaut", "françois truffaut"),  # accented
        ("Franc\u0327ois Truffaut", "François Truffaut"),  # decomposed vs composed cedilla
        ("Müller", "MÜLLER"),
        ("東京", "東京。"),  # ideographic full stop
        ("「東京」", "東京"),  # CJK brackets
        ("Ｔｏｋｙｏ！", "tokyo"),  # full-width letters and punctuation
        ("Москва", "москва"),  # Cyrillic
        ("Straße", "STRASSE"),  # casefold
        ("Ἀθῆναι", "ἀθῆναι"),  # Greek
    ],
)
def test_unicode_answers(prediction: str, truth: str) -> None:
    assert score(f"<answer>{prediction}</answer>", truth)["correctness"] == 1.0


def test_accents_are_kept() -> None:
    assert score("<answer>Muller</answer>", "Müller")["correctness"] == 0.0


def test_normalize_answer() -> None:
    assert normalize_answer("  The  Quick, brown fox!! ") == "quick brown fox"
    assert normalize_answer("Ｈｅｌｌｏ，　ｗｏｒｌｄ") == "hello world"
    assert normalize_answer("the a an") == ""


@pytest.mark.parametrize(
    "ground_truth",
    [
        ["NYC", "New York City", "New York"],
        ("New York", "NYC"),
        np.array(["NYC", "New York"]),
        np.array(["NYC", "New York"], dtype=object),
        {"target": ["NYC", "New York"]},
        {"target": np.array(["NYC", "New York"])},
        {"answer": "New York"},
        {"answers": ["New York"]},
        {"ground_truth": {"target": ["New York"]}},
        [["NYC"], ["New York"]],
    ],
)
def test_every_alias_shape_is_accepted(ground_truth: object) -> None:
    assert score("<answer>new york</answer>", ground_truth)["correctness"] == 1.0
    assert score("<answer>Boston</answer>", ground_truth)["correctness"] == 0.0


class Aliases:
    """A numpy-free iterable of strings, neither list nor tuple."""

    def __init__(self, *aliases: str) -> None:
        self._aliases = aliases

    def __iter__(self) -> Iterator[str]:
        return iter(self._aliases)


def test_duck_typed_iterables_of_strings() -> None:
    assert score("<answer>NYC</answer>", Aliases("New York", "NYC"))["correctness"] == 1.0
    assert score("<answer>NYC</answer>", (alias for alias in ["NYC"]))["correctness"] == 1.0
    assert score("<answer>NYC</answer>", {"NYC", "New York"})["correctness"] == 1.0


def test_numeric_ground_truth() -> None:
    assert score("<answer>1912</answer>", 1912)["correctness"] == 1.0
    assert score("<answer>1912</answer>", [1912, "nineteen twelve"])["correctness"] == 1.0


def test_answer_aliases_flatten_in_order() -> None:
    assert answer_aliases({"target": np.array(["a", "b"]), "answer": "c"}) == ["a", "b", "c"]
    assert answer_aliases([]) == []


@pytest.mark.parametrize("ground_truth", [None, b"Paris", True, {"label": "Paris"}, 3j])
def test_unsupported_ground_truth_is_an_error(ground_truth: object) -> None:
    with pytest.raises(TypeError):
        score("<answer>Paris</answer>", ground_truth)


@pytest.mark.parametrize("ground_truth", ["", [], ["", "   "], "the", {"target": []}])
def test_empty_ground_truth_accepts_nothing(ground_truth: object) -> None:
    for prediction in ["", "the", "Paris", "."]:
        assert score(f"<answer>{prediction}</answer>", ground_truth)["correctness"] == 0.0


# --- results are not the model's answer --------------------------------------------------------------------------


def test_answer_inside_result_does_not_count() -> None:
    solution = "<search>q</search><result>Doc: <answer>Steven Spielberg</answer></result>"
    result = score(solution)
    assert result["correctness"] == 0.0
    assert result["format"] == 0.0
    assert result["n_calls"] == 1
    assert result["call_success"] == 1.0


def test_answer_after_result_with_fake_answer_counts_the_models_answer() -> None:
    solution = (
        "<search>q</search><result>Doc: <answer>George Lucas</answer> and </result> tags</result>"
        "<answer>Steven Spielberg</answer>"
    )
    # the first </result> closes the block: the leftover " tags</result>" is a stray tag, so not well formed
    result = score(solution)
    assert result["correctness"] == 1.0
    assert result["format"] == 0.0
    solution = "<search>q</search><result>Doc: <answer>George Lucas</answer></result><answer>Steven Spielberg</answer>"
    assert score(solution)["correctness"] == 1.0
    assert score(solution)["format"] == 1.0
    assert score(solution, "George Lucas")["correctness"] == 0.0


def test_result_splitting_an_answer_is_removed() -> None:
    solution = "<answer>Steven <result>George</result>Spielberg</answer>"
    assert last_answer(read_transcript(solution).model_text) == "Steven Spielberg"


def test_unclosed_result_hides_the_rest() -> None:
    solution = "<search>q</search><result>Doc <answer>Steven Spielberg</answer>"
    result = score(solution)
    assert result["correctness"] == 0.0
    assert result["format"] == 0.0
    transcript = read_transcript(solution)
    assert transcript.model_text == "<search>q</search>"
    assert transcript.skeleton == "<search>q</search><result>"
    assert transcript.results == ["Doc <answer>Steven Spielberg</answer>"]


def test_tags_inside_results_are_opaque() -> None:
    solution = "<search>q</search><result><think><search>x</result><answer>Steven Spielberg</answer>"
    transcript = read_transcript(solution)
    assert transcript.tags == ["<search>", "</search>", "<result>", "</result>", "<answer>", "</answer>"]
    assert transcript.results == ["<think><search>x"]
    assert score(solution)["format"] == 1.0
    assert score(solution)["n_calls"] == 1


# --- format -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "solution",
    [
        "<answer>Steven Spielberg</answer>",
        "<think>easy</think>\n<answer>Steven Spielberg</answer>\n",
        WELL_FORMED,
        WELL_FORMED + "<|im_end|>",
        WELL_FORMED + " </s> \n",
        "<think>a</think><search>q</search>\nuser\n<result>d</result>\nassistant\n<answer>Steven Spielberg</answer>",
        "<search>q</search><result></result><answer>Steven Spielberg</answer>",  # a failed call is still well formed
    ],
)
def test_well_formed(solution: str) -> None:
    assert score(solution)["format"] == 1.0


@pytest.mark.parametrize(
    "solution",
    [
        "",
        "Steven Spielberg",
        "<answer>Steven Spielberg",  # unclosed answer
        "Steven Spielberg</answer>",  # stray closing tag
        "<think>hmm<answer>Steven Spielberg</answer></think>",  # nested
        "<think>hmm</think></think><answer>Steven Spielberg</answer>",  # extra closing tag
        "<think>hmm<answer>Steven Spielberg</answer>",  # unclosed think
        "<search>q<answer>Steven Spielberg</answer>",  # unclosed search
        "<answer>Steven Spielberg</search>",  # mismatched
        "<answer>George Lucas</answer><answer>Steven Spielberg</answer>",  # two answers
        "<answer>Steven Spielberg</answer> and more text",  # text after the answer
        "<answer>Steven Spielberg</answer><search>more</search>",  # a call after the answer
        "<answer>   </answer>",  # blank answer
        "<answer>Steven Spielberg</answer><|im_end|>extra",
    ],
)
def test_malformed(solution: str) -> None:
    result = score(solution)
    assert result["format"] == 0.0


def test_malformed_but_answered_still_gets_correctness() -> None:
    result = score("<think>hmm<answer>Steven Spielberg</answer></think>")
    assert result["correctness"] == 1.0
    assert result["format"] == 0.0
    assert result["score"] == pytest.approx(0.9)


def test_is_well_formed_directly() -> None:
    assert is_well_formed(read_transcript("<think>t</think><answer>x</answer>"))
    assert not is_well_formed(read_transcript("<think>t</answer>"))
    assert not is_well_formed(read_transcript("<answer>x</answer><result>late</result>"))


def test_read_transcript_keeps_the_order_of_blocks() -> None:
    transcript = read_transcript("a<result>b</result>c<result>d<result>e</result>f</result>g<result>h")
    assert transcript.model_text == "acf</result>g"  # the first </result> closes; the second is stray
    assert transcript.skeleton == "a<result></result>c<result></result>f</result>g<result>"
    assert transcript.results == ["b", "d<result>e", "h"]
    assert transcript.tags == ["<result>", "</result>", "<result>", "</result>", "</result>", "<result>"]


@pytest.mark.parametrize("solution", ["<Answer>x</Answer>", "<answer >x</answer >", "< answer>x</ answer>"])
def test_only_exact_lowercase_tags_are_protocol_tags(solution: str) -> None:
    result = score(solution, "x")
    assert result["correctness"] == 0.0
    assert result["format"] == 0.0


# --- search calls -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("solution", "n_calls", "call_success"),
    [
        ("<answer>x</answer>", 0, 0.0),
        ("", 0, 0.0),
        ("<search>a</search><result>doc</result><answer>x</answer>", 1, 1.0),
        ("<search>a</search><result>  \n </result><answer>x</answer>", 1, 0.0),
        ("<search>a</search><answer>x</answer>", 1, 0.0),  # no result came back
        (
            "<search>a</search><result>d1</result><search>b</search><result></result>"
            "<search>c</search><result>d3</result><search>d</search><result>d4</result>",
            4,
            0.75,
        ),
        ("<search>a</search><search>b</search><result>d</result>", 2, 0.5),  # one result for the later call
        ("<result>d</result><search>a</search>", 1, 0.0),  # a result before any call answers nothing
        ("<search>a</search><result>d</result><result>e</result>", 1, 1.0),  # a second result is not a call
        ("<search>a</search><result>cut off", 1, 1.0),  # truncated result still brought text back
        ("<search>a</search><result>Doc <search>b</search></result>", 1, 1.0),  # search text in a document
    ],
)
def test_search_calls(solution: str, n_calls: int, call_success: float) -> None:
    result = score(solution, "x")
    assert result["n_calls"] == n_calls
    assert type(result["n_calls"]) is int
    assert result["call_success"] == pytest.approx(call_success)


# --- length -----------------------------------------------------------------------------------------------------


def test_length_tiers_in_order() -> None:
    low, high = sorted(LENGTH_PENALTY_TIERS)
    assert low[0] < high[0]
    assert 1.0 > low[1] > high[1] >= 0.0


@pytest.mark.parametrize(
    ("n_chars", "expected"),
    [(0, 1.0), (4000, 1.0), (4001, 0.5), (8000, 0.5), (8001, 0.0), (1_000_000, 0.0)],
)
def test_length_penalty_tiers(n_chars: int, expected: float) -> None:
    # 8001 gets the lowest tier: the seed tutorial's ``> 8000`` branch, checked after ``> 4000``, never ran
    assert length_penalty(n_chars) == expected


def test_length_counts_the_models_text_not_the_retrieved_documents() -> None:
    documents = "<search>q</search><result>" + "d" * 20_000 + "</result>"
    result = score(documents + "<answer>Steven Spielberg</answer>")
    assert result["length_penalty"] == 1.0
    assert result["score"] == pytest.approx(1.0)
    rambling = "<think>" + "t" * 9000 + "</think><answer>Steven Spielberg</answer>"
    result = score(rambling)
    assert result["length_penalty"] == 0.0
    assert result["score"] == pytest.approx(0.8)


def test_length_penalty_only_scales_a_correct_answer() -> None:
    rambling = "<think>" + "t" * 9000 + "</think><answer>George Lucas</answer>"
    result = score(rambling)
    assert result["length_penalty"] == 0.0
    assert result["score"] == pytest.approx(0.1)


# --- huge responses stay fast -----------------------------------------------------------------------------------

MEGABYTE = 1_000_000


@pytest.mark.parametrize(
    "solution",
    [
        "a" * MEGABYTE + "<answer>Steven Spielberg</answer>",
        "<answer>" * (MEGABYTE // 8),  # many openings, never closed
        "</answer>" * (MEGABYTE // 9),
        "<answer>" + "x " * (MEGABYTE // 2) + "</answer>",  # a 1 MB answer to normalise
        "<" * MEGABYTE,
        "<result>" * (MEGABYTE // 8),  # one block cut off, holding the rest
        "<result>" * (MEGABYTE // 8) + "</result>",
        "</result>" * (MEGABYTE // 9),
        "<result></result>" * (MEGABYTE // 17),
        "<think>a</think>" * (MEGABYTE // 16),
        "<search>q</search><result>doc</result>" * (MEGABYTE // 38) + "<answer>Steven Spielberg</answer>",
        "<think>" * (MEGABYTE // 14) + "</think>" * (MEGABYTE // 16),
        ("the, " * (MEGABYTE // 5)).join(["<answer>", "</answer>"]),
        "東京。" * (MEGABYTE // 3),
    ],
)
def test_one_megabyte_response_is_fast(solution: str) -> None:
    start = time.perf_counter()
    result = score(solution)
    elapsed = time.perf_counter() - start
    assert elapsed < 0.5, f"{elapsed:.3f}s"
    assert set(result) == KEYS


def test_one_megabyte_response_values() -> None:
    result = score("<search>q</search><result>doc</result>" * (MEGABYTE // 38) + "<answer>Steven Spielberg</answer>")
    assert result["n_calls"] == MEGABYTE // 38
    assert result["call_success"] == 1.0
    assert result["correctness"] == 1.0
    assert result["format"] == 1.0
    assert result["length_penalty"] == 0.0  # the searches themselves are the model's text
