"""Evaluation of the search agent: the chat transcript over an OpenAI-compatible endpoint, the official HotpotQA
and GAIA scorers, and the eval CLIs end to end.

The endpoint is a scripted stand-in for ``vllm serve`` on loopback (real HTTP, ``http.server`` in a thread). It
honours what vLLM honours — ``continue_final_message``, ``stop``, ``include_stop_str_in_output``, ``max_tokens``
— and answers with vLLM's ``finish_reason`` / ``stop_reason`` / ``usage``, one character = one token. It checks
every request: the vLLM parameters the transcript depends on, the prompt messages, and that the assistant
message it continues is exactly the transcript so far (its own earlier outputs plus well-formed observations).
The retriever is an in-process fake. GAIA rows are synthetic, with the real field names (GAIA must not be
redistributed).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import RetrievalServer, free_port

from recipe import eval_gaia, eval_hotpotqa
from recipe.agent.episode import Ending, EpisodeLimits, TurnEnd, run_episode
from recipe.agent.openai_chat import ChatEndpoint, ChatTranscript, EndpointError
from recipe.agent.protocol import STOP_STRINGS, format_observation
from recipe.prompt import build_messages
from recipe.reward import compute_score
from recipe.scoring import (
    best_score,
    exact_match_score,
    extract_answer,
    f1_score,
    gaia_verdict,
    normalize_answer,
    question_scorer,
)
from recipe.scoring.gaia import AnswerKind
from recipe.search.passage import Passage, RetrievalError

REPO = Path(__file__).resolve().parents[2]
HOTPOT_FIXTURE = REPO / "tests" / "fixtures" / "recipe" / "hotpotqa_train_100.json"
MODEL = "checkpoints/step_500"
FILLER = " and so on"


# ================================================================ the scripted vLLM stand-in


@dataclass(frozen=True)
class Reply:
    """What the scripted model writes on one turn. Generation stops at the first stop string (as vLLM does); with
    ``eos`` the model ends its message after ``text``; otherwise it keeps writing filler until ``max_tokens``.
    ``overrun`` is text an engine emitted past the stop string, which the client must cut."""

    text: str
    eos: bool = False
    overrun: str = ""


def generate(reply: Reply, stop: Sequence[str], max_tokens: int) -> tuple[str, str, str | None, int, str]:
    """(content, finish_reason, stop_reason, completion_tokens, text the client keeps) as vLLM would answer with
    ``include_stop_str_in_output``, one character per token (EOS is one more token)."""
    hits = [(found, s) for s in stop if (found := reply.text.find(s)) >= 0]
    if hits:
        start, stop_string = min(hits)
        end = start + len(stop_string)
        if end <= max_tokens:
            kept = reply.text[:end]
            return kept + reply.overrun, "stop", stop_string, end + len(reply.overrun), kept
    if reply.eos and len(reply.text) + 1 <= max_tokens:
        return reply.text, "stop", None, len(reply.text) + 1, reply.text
    rambling = (reply.text + FILLER * (max_tokens // len(FILLER) + 1))[:max_tokens]
    return rambling, "length", None, max_tokens, rambling


class QuietServer(ThreadingHTTPServer):
    """A client that hangs up (a cancelled episode) is not an error worth a traceback on stderr."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class ScriptedVLLM:
    """``POST /v1/chat/completions`` and ``GET /v1/models`` of a scripted model: ``script[question][turn]`` is
    the reply to the ``turn``-th request for ``question``. ``queued`` replies (status, raw body) are served first,
    to exercise the client's error handling. Every request is kept in ``requests``; anything a vLLM client must
    not do lands in ``violations`` (and is answered 400, like vLLM's validation errors)."""

    def __init__(
        self, script: Mapping[str, Sequence[Reply]], *, model: str = MODEL, report_stop_reason: bool = True
    ) -> None:
        self.script = script
        self.model = model
        self.report_stop_reason = report_stop_reason
        self.requests: list[dict[str, Any]] = []
        self.violations: list[str] = []
        self.queued: list[tuple[int, str]] = []
        self._turns: dict[str, int] = {}
        self._written: dict[str, str] = {}  # question -> the assistant text after the last reply
        self._lock = threading.Lock()
        self._server = QuietServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.01,), daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def requests_for(self, question: str) -> list[dict[str, Any]]:
        return [body for body in self.requests if body["messages"][1]["content"] == f"Question: {question}"]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return None

            def _send(self, status: int, body: str) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._send(200, json.dumps({"object": "list", "data": [{"id": scripted.model}]}))
                else:
                    self._send(404, json.dumps({"detail": "Not Found"}))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                if self.path != "/v1/chat/completions":
                    self._send(404, json.dumps({"detail": "Not Found"}))
                    return
                self._send(*scripted.chat(body))

        return Handler

    def _violation(self, message: str) -> tuple[int, str]:
        self.violations.append(message)
        return 400, json.dumps({"object": "error", "message": message, "type": "BadRequestError", "code": 400})

    def chat(self, body: dict[str, Any]) -> tuple[int, str]:
        with self._lock:
            self.requests.append(body)
            if self.queued:
                return self.queued.pop(0)
            needed = {
                "model": self.model,
                "continue_final_message": True,
                "add_generation_prompt": False,
                "include_stop_str_in_output": True,
                "stop": list(STOP_STRINGS),
            }
            for key, value in needed.items():
                if body.get(key) != value:
                    return self._violation(f"{key} must be {value!r}, got {body.get(key)!r}")
            max_tokens = body.get("max_tokens")
            if not isinstance(max_tokens, int) or max_tokens < 1:
                return self._violation(f"max_tokens must be a positive integer, got {max_tokens!r}")
            messages = body.get("messages")
            if not isinstance(messages, list) or len(messages) != 3 or messages[2].get("role") != "assistant":
                return self._violation("expected [system, user, assistant] messages")
            question = messages[1]["content"].removeprefix("Question: ")
            if messages[:2] != build_messages(question):
                return self._violation("the system and user messages are not build_messages(question)")
            if question not in self.script:
                return self._violation(f"no script for {question!r}")
            prefix = messages[2]["content"]
            if prefix == "":  # a new episode of this question
                self._turns[question], self._written[question] = 0, ""
            turn = self._turns.get(question, 0)
            written = self._written.get(question, "")
            if not prefix.startswith(written):
                return self._violation(f"turn {turn}: the assistant prefix is not the transcript so far")
            observation = prefix[len(written) :]
            if turn == 0 and observation:
                return self._violation("the first request must continue an empty assistant message")
            if turn > 0 and not (observation.startswith("\n\n<result>\n") and observation.endswith("</result>\n\n")):
                return self._violation(f"turn {turn}: expected one observation after the last reply")
            if turn >= len(self.script[question]):
                return self._violation(f"turn {turn} of {question!r} is not scripted")
            content, finish, stop_reason, tokens, kept = generate(self.script[question][turn], body["stop"], max_tokens)
            self._turns[question] = turn + 1
            self._written[question] = prefix + kept
            prompt_tokens = sum(len(message["content"]) for message in messages)
            reply = {
                "id": f"chatcmpl-{len(self.requests)}",
                "object": "chat.completion",
                "created": 0,
                "model": self.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content, "tool_calls": []},
                        "logprobs": None,
                        "finish_reason": finish,
                        "stop_reason": stop_reason if self.report_stop_reason else None,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": tokens,
                    "total_tokens": prompt_tokens + tokens,
                },
            }
            return 200, json.dumps(reply)


@pytest.fixture
def vllm() -> Iterator[Callable[..., ScriptedVLLM]]:
    servers: list[ScriptedVLLM] = []

    def start(script: Mapping[str, Sequence[Reply]], **options: Any) -> ScriptedVLLM:
        server = ScriptedVLLM(script, **options)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()
    for server in servers:
        assert server.violations == [], server.violations


class FakeSearcher:
    """The retriever: fixed passages per query; ``failing`` queries raise RetrievalError."""

    def __init__(self, corpus: Mapping[str, Sequence[Passage]] | None = None, failing: frozenset[str] = frozenset()):
        self.corpus = corpus or {}
        self.failing = failing
        self.calls: list[tuple[tuple[str, ...], int]] = []

    async def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        self.calls.append((tuple(queries), topk))
        await asyncio.sleep(0)
        if any(query in self.failing for query in queries):
            raise RetrievalError(f"fake retriever: {list(queries)} failed")
        return [list(self.corpus.get(query, ()))[:topk] for query in queries]


def passage(title: str, text: str) -> Passage:
    return Passage(doc_id=title.lower().replace(" ", "-"), title=title, text=text, score=1.0)


def endpoint(server: ScriptedVLLM, **options: Any) -> ChatEndpoint:
    return ChatEndpoint(server.base_url, MODEL, backoff_s=0.0, **options)


async def run_turns(transcript: ChatTranscript, count: int = 1) -> list[Any]:
    try:
        return [await transcript.generate(STOP_STRINGS) for _ in range(count)]
    finally:
        await transcript.endpoint.aclose()


# ================================================================ ChatTranscript


def test_a_turn_ending_on_a_stop_string_is_stop_and_the_request_carries_what_vllm_needs(vllm: Any) -> None:
    server = vllm({"Q?": [Reply("<think>look it up</think><search>capital of France</search>")]})
    transcript = ChatTranscript(endpoint(server), "Q?", max_response_tokens=500)
    [turn] = asyncio.run(run_turns(transcript))
    assert turn.end is TurnEnd.STOP
    assert turn.text == "<think>look it up</think><search>capital of France</search>"
    [request] = server.requests
    assert request["messages"] == [*build_messages("Q?"), {"role": "assistant", "content": ""}]
    assert request["max_tokens"] == 500 and request["temperature"] == 0.0
    assert transcript.full_text == turn.text and transcript.tokens_used == len(turn.text)


def test_a_turn_the_model_ends_is_eos(vllm: Any) -> None:
    server = vllm({"Q?": [Reply("I would rather not say.", eos=True)]})
    [turn] = asyncio.run(run_turns(ChatTranscript(endpoint(server), "Q?")))
    assert turn == type(turn)("I would rather not say.", TurnEnd.EOS)
    assert server.requests[0]["messages"][-1] == {"role": "assistant", "content": ""}


def test_a_turn_out_of_budget_is_length_and_the_next_one_asks_nothing(vllm: Any) -> None:
    server = vllm({"Q?": [Reply("<think>hmm")]})
    transcript = ChatTranscript(endpoint(server), "Q?", max_response_tokens=25)
    first, second = asyncio.run(run_turns(transcript, 2))
    assert first.end is TurnEnd.LENGTH and len(first.text) == 25 and first.text.startswith("<think>hmm and so on")
    assert second.text == "" and second.end is TurnEnd.LENGTH
    assert len(server.requests) == 1 and transcript.tokens_left == 0


def test_text_past_the_stop_string_is_cut(vllm: Any) -> None:
    server = vllm({"Q?": [Reply("<answer>Paris</answer>", overrun="\n<search>more")]})
    [turn] = asyncio.run(run_turns(ChatTranscript(endpoint(server), "Q?")))
    assert turn.text == "<answer>Paris</answer>" and turn.end is TurnEnd.STOP


def test_without_stop_reason_a_text_ending_on_a_stop_string_is_stop(vllm: Any) -> None:
    server = vllm({"Q?": [Reply("<search>x</search>"), Reply("done", eos=True)]}, report_stop_reason=False)
    transcript = ChatTranscript(endpoint(server), "Q?")

    async def two_turns() -> list[Any]:
        first = await transcript.generate(STOP_STRINGS)
        assert transcript.observe(format_observation([], 3000))
        second = await transcript.generate(STOP_STRINGS)
        await transcript.endpoint.aclose()
        return [first, second]

    first, second = asyncio.run(two_turns())
    assert first.end is TurnEnd.STOP and second.end is TurnEnd.EOS


def test_the_budget_counts_observations_by_estimate_then_by_the_measured_prompt(vllm: Any) -> None:
    budget = 400
    server = vllm({"B?": [Reply("<search>abc</search>"), Reply("<search>def</search>"), Reply("<answer>x</answer>")]})
    transcript = ChatTranscript(endpoint(server), "B?", max_response_tokens=budget, chars_per_token=3.0)
    first_obs = format_observation([passage("Abc", "Abc is a word of three letters.")], 3000)
    second_obs = format_observation([passage("Def", "Def is another one.")], 3000)

    async def episode() -> None:
        await transcript.generate(STOP_STRINGS)
        assert transcript.observe(first_obs)
        assert transcript.tokens_used == 20 + math.ceil(len(first_obs) / 3)
        await transcript.generate(STOP_STRINGS)
        assert transcript.tokens_used == 20 + len(first_obs) + 20  # re-measured from usage.prompt_tokens
        assert transcript.observe(second_obs)
        await transcript.generate(STOP_STRINGS)
        await transcript.endpoint.aclose()

    asyncio.run(episode())
    sent = [request["max_tokens"] for request in server.requests]
    assert sent == [
        budget,
        budget - 20 - math.ceil(len(first_obs) / 3),
        budget - 40 - len(first_obs) - math.ceil(len(second_obs) / 3),
    ]
    assert server.requests[2]["messages"][-1]["content"] == "<search>abc</search>" + first_obs + (
        "<search>def</search>" + second_obs
    )
    assert transcript.full_text.endswith(second_obs + "<answer>x</answer>")


def test_an_observation_the_budget_cannot_hold_is_refused(vllm: Any) -> None:
    server = vllm({"Q?": [Reply("<search>abc</search>")]})
    transcript = ChatTranscript(endpoint(server), "Q?", max_response_tokens=30)
    asyncio.run(run_turns(transcript))
    assert not transcript.observe("x" * 31)
    assert transcript.full_text == "<search>abc</search>" and transcript.tokens_used == 20


# ---------------------------------------------------------------- endpoint errors


def complete_once(chat: ChatEndpoint) -> Any:
    async def call() -> Any:
        try:
            return await chat.complete([*build_messages("Q?"), {"role": "assistant", "content": ""}], STOP_STRINGS, 50)
        finally:
            await chat.aclose()

    return asyncio.run(call())


def test_a_5xx_is_retried(vllm: Any) -> None:
    server = vllm({"Q?": [Reply("<answer>a</answer>")]})
    server.queued.append((503, json.dumps({"object": "error", "message": "engine overloaded"})))
    completion = complete_once(endpoint(server, retries=1))
    assert completion.text == "<answer>a</answer>" and completion.finish_reason == "stop"
    assert completion.stop_reason == "</answer>" and len(server.requests) == 2


def test_5xx_past_the_retries_is_one_endpoint_error(vllm: Any) -> None:
    server = vllm({"Q?": []})
    server.queued += [(500, json.dumps({"object": "error", "message": "engine overloaded"}))] * 2
    with pytest.raises(EndpointError) as raised:
        complete_once(endpoint(server, retries=1))
    message = str(raised.value)
    assert f"{server.base_url}/chat/completions" in message
    assert "HTTP 500: engine overloaded" in message and "after 2 attempts" in message


def test_a_4xx_is_not_retried_and_says_what_vllm_said(vllm: Any) -> None:
    server = vllm({"Q?": []})
    too_long = "This model's maximum context length is 4096 tokens."
    server.queued.append((400, json.dumps({"object": "error", "message": too_long, "code": 400})))
    with pytest.raises(EndpointError, match=r"HTTP 400: This model's maximum context length is 4096 tokens\."):
        complete_once(endpoint(server, retries=3))
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        ("<html>gateway</html>", "the reply is not JSON"),
        (json.dumps({"choices": []}), "not a chat completion: no choices[0]"),
        (
            json.dumps({"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}]}),
            "not a chat completion: no usage.completion_tokens",
        ),
        (
            json.dumps({"choices": [{"message": {"role": "assistant"}, "finish_reason": "stop"}]}),
            "not a chat completion: no choices[0].message.content",
        ),
    ],
)
def test_a_malformed_reply_is_one_endpoint_error(vllm: Any, body: str, complaint: str) -> None:
    server = vllm({"Q?": []})
    server.queued.append((200, body))
    with pytest.raises(EndpointError, match=re.escape(complaint)):
        complete_once(endpoint(server))


def test_an_unreachable_endpoint_is_one_endpoint_error() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(EndpointError) as raised:
        complete_once(ChatEndpoint(url, MODEL, retries=1, backoff_s=0.0))
    assert f"{url}/chat/completions: cannot reach it (ConnectError" in str(raised.value)
    assert "after 2 attempts" in str(raised.value)


# ================================================================ the turn loop over the chat transcript


def test_an_episode_searches_reads_the_result_and_answers(vllm: Any) -> None:
    question = "Who directed Jaws?"
    script = {
        question: [
            Reply("<think>I need the director.</think>\n<search>Jaws director</search>"),
            Reply("<think>The passage says Spielberg.</think>\n<answer>Steven Spielberg</answer>", overrun="\n"),
        ]
    }
    server = vllm(script)
    jaws = passage("Jaws (film)", "Jaws is a 1975 film directed by Steven Spielberg.")
    searcher = FakeSearcher({"Jaws director": [jaws]})
    transcript = ChatTranscript(endpoint(server), question, max_response_tokens=2000)

    async def episode() -> Any:
        try:
            return await run_episode(transcript, searcher, EpisodeLimits(max_turns=4, topk=2))
        finally:
            await transcript.endpoint.aclose()

    result = asyncio.run(episode())
    assert result.ending is Ending.ANSWERED and result.answer == "Steven Spielberg"
    assert result.turns == 2 and result.queries == ["Jaws director"] and result.failed_searches == 0
    assert searcher.calls == [(("Jaws director",), 2)]
    observation = format_observation([jaws], 3000)
    assert transcript.full_text == (
        "<think>I need the director.</think>\n<search>Jaws director</search>"
        + observation
        + "<think>The passage says Spielberg.</think>\n<answer>Steven Spielberg</answer>"
    )
    assert server.requests[1]["messages"][-1]["content"] == script[question][0].text + observation
    scored = compute_score("hotpotqa", transcript.full_text, {"target": ["Steven Spielberg"]})
    assert scored["correctness"] == 1.0 and scored["format"] == 1.0 and scored["n_calls"] == 1
    assert extract_answer(transcript.full_text) == "Steven Spielberg"


# ================================================================ HotpotQA scoring (hotpot_evaluate_v1.py)


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("The Beatles!", "beatles"),
        ("  a  Spirit ", "spirit"),
        ("Columbus, Ohio", "columbus ohio"),
        ("Théâtre—the Play", "théâtre— play"),  # ASCII punctuation only, as the script: the em dash stays
        ("an apple, the pear and a plum", "apple pear and plum"),
        ("U.S.A.", "usa"),
    ],
)
def test_normalize_answer_is_the_official_one(text: str, normalized: str) -> None:
    assert normalize_answer(text) == normalized


def test_em_and_f1_by_hand() -> None:
    assert exact_match_score("The Spirit.", "a spirit")
    assert not exact_match_score("Latin language", "Latin")
    assert f1_score("Latin language", "Latin") == pytest.approx((2 / 3, 1 / 2, 1.0))
    assert f1_score("Telemann", "Georg Philipp Telemann") == pytest.approx((1 / 2, 1.0, 1 / 3))
    assert f1_score("the cat sat on the mat", "a cat on a mat") == pytest.approx((6 / 7, 3 / 4, 1.0))
    assert f1_score("Paris", "London") == (0.0, 0.0, 0.0)


def test_f1_is_zero_when_a_yes_no_side_differs() -> None:
    assert f1_score("no", "no way") == (0.0, 0.0, 0.0)  # would share "no" without the rule
    assert f1_score("yes it is", "yes") == (0.0, 0.0, 0.0)
    assert f1_score("noanswer", "no answer") == (0.0, 0.0, 0.0)
    assert f1_score("Yes.", "yes") == (1.0, 1.0, 1.0)


def test_best_score_takes_the_best_alias_and_zero_without_an_answer() -> None:
    aliases = ["Barack Obama", "Obama", "Barack Hussein Obama II"]
    assert best_score("obama", aliases).em == 1.0 and best_score("obama", aliases).f1 == 1.0
    partial = best_score("President Obama", aliases)
    assert partial.em == 0.0 and partial.f1 == pytest.approx(2 / 3)  # vs "Obama": P 1/2, R 1
    assert best_score(None, aliases) == best_score("anything", []) == type(partial)(0.0, 0.0)


# ================================================================ GAIA scoring (question_scorer)


@pytest.mark.parametrize(
    ("answer", "truth", "correct"),
    [
        ("$1,000", "1000", True),
        ("1000.0", "1000", True),
        ("12%", "12", True),
        ("1 000", "1000", False),  # a space is not stripped from numbers
        ("about 7", "7", False),
        ("7", "7.0", True),
    ],
)
def test_gaia_numbers(answer: str, truth: str, correct: bool) -> None:
    verdict = gaia_verdict(answer, truth)
    assert verdict.kind is AnswerKind.NUMBER and verdict.correct is correct


@pytest.mark.parametrize(
    ("answer", "truth", "correct"),
    [
        ("Red,green;Blue", "red, green; blue", True),
        ("red; green, blue", "red, green, blue", True),  # either separator on either side
        ("3, $4,5", "3, 4, 5", True),  # "$4" is the number 4
        ("a.b, c", "a.b, c", True),
        ("ab, c", "a.b, c", False),  # list elements keep their punctuation
        ("blue, green, red", "red, green, blue", False),  # order matters
    ],
)
def test_gaia_lists(answer: str, truth: str, correct: bool) -> None:
    verdict = gaia_verdict(answer, truth)
    assert verdict.kind is AnswerKind.LIST and verdict.correct is correct and not verdict.length_mismatch


def test_a_gaia_list_of_another_length_is_wrong_and_says_so() -> None:
    verdict = gaia_verdict("apple", "apple, banana")
    assert not verdict.correct and verdict.length_mismatch and verdict.kind is AnswerKind.LIST
    assert gaia_verdict("1000", "1,000").length_mismatch  # "1,000" is a list of "1" and "000"


@pytest.mark.parametrize(
    ("answer", "truth", "correct"),
    [
        ("seagull", "Sea gull", True),
        ("St. Petersburg", "st petersburg", True),
        ("  PARIS\n", "Paris", True),
        ("Beatles", "The Beatles", False),  # articles are kept
        ("Paris, France", "Paris", False),
    ],
)
def test_gaia_strings(answer: str, truth: str, correct: bool) -> None:
    verdict = gaia_verdict(answer, truth)
    assert verdict.kind is AnswerKind.STRING and verdict.correct is correct


def test_no_answer_is_wrong_under_every_rule() -> None:
    assert not any(question_scorer(None, truth) for truth in ("7", "a, b", "None"))


def test_the_answer_is_the_last_one_outside_results() -> None:
    response = "<answer>first</answer><result>Doc 1 <answer>leaked</answer></result><answer>last</answer>"
    assert extract_answer(response) == "last"
    assert extract_answer("<search>q</search><result><answer>leaked</answer></result>") is None


# ================================================================ eval_hotpotqa end to end


def hotpot_records(count: int) -> list[dict[str, Any]]:
    return json.loads(HOTPOT_FIXTURE.read_text(encoding="utf-8"))[:count]


def search_then(query: str, answer: str) -> list[Reply]:
    return [Reply(f"<think>Look it up.</think>\n<search>{query}</search>"), Reply(f"<answer>{answer}</answer>")]


def hotpot_script(records: Sequence[Mapping[str, Any]]) -> dict[str, list[Reply]]:
    """The scripted model on the first 10 fixture questions; EM/F1 by hand next to each."""
    q = [str(record["question"]).strip() for record in records]
    return {
        q[0]: search_then("Gallu demon", "Spirit"),  # gold "a spirit": EM 1, F1 1
        q[1]: [Reply("<answer>no</answer>")],  # gold "yes": 0, 0
        q[2]: search_then("Haymo of Faversham", "Latin language"),  # gold "Latin": EM 0, F1 2/3
        q[3]: [  # gold "Stephen King": two searches, then EM 1, F1 1
            Reply("<search>film shot in Leland North Carolina 1986</search>"),
            Reply("<search>Maximum Overdrive director</search>"),
            Reply("<answer>Stephen King</answer>"),
        ],
        q[4]: [Reply("<think>Both are.</think><answer>No.</answer>")],  # gold "no": 1, 1
        q[5]: [Reply("<think>Let me think about luaus")],  # never stops: response budget -> length, 0, 0
        q[6]: [Reply("<answer>Telemann</answer>")],  # gold "Georg Philipp Telemann": EM 0, F1 1/2
        q[7]: [Reply("I cannot tell.", eos=True)],  # the model ends without an answer: stopped, 0, 0
        q[8]: [Reply("<answer>yes</answer>")],  # gold "no": 0, 0
        q[9]: [Reply("<search>1999 runner-up</search>")] * 3,  # searches until --max-turns 3: turns, 0, 0
    }


HOTPOT_CORPUS = {
    "Gallu demon": [passage("Gallu", "Gallu is a demon of the underworld; Lilu is a spirit.")],
    "Haymo of Faversham": [passage("Haymo of Faversham", "Books were translated into Latin.")],
    "film shot in Leland North Carolina 1986": [passage("Maximum Overdrive", "Shot near Leland in 1986.")],
    "Maximum Overdrive director": [passage("Maximum Overdrive", "Directed by Stephen King.")],
}

EXPECTED_HOTPOT = [  # (prediction, em, f1, ending, turns, searches)
    ("Spirit", 1.0, 1.0, "answered", 2, 1),
    ("no", 0.0, 0.0, "answered", 1, 0),
    ("Latin language", 0.0, 2 / 3, "answered", 2, 1),
    ("Stephen King", 1.0, 1.0, "answered", 3, 2),
    ("No.", 1.0, 1.0, "answered", 1, 0),
    (None, 0.0, 0.0, "length", 1, 0),
    ("Telemann", 0.0, 0.5, "answered", 1, 0),
    (None, 0.0, 0.0, "stopped", 1, 0),
    ("yes", 0.0, 0.0, "answered", 1, 0),
    (None, 0.0, 0.0, "turns", 3, 2),
]


def hotpot_args(server: ScriptedVLLM, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--data",
        str(data),
        "--endpoint",
        server.base_url,
        "--model",
        MODEL,
        "--out",
        str(out),
        "--max-turns",
        "3",
        "--max-response-tokens",
        "400",
        "--concurrency",
        "4",
        *extra,
    ]


def read_run(out: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    assert sorted(path.name for path in out.iterdir()) == ["predictions.jsonl", "summary.json"]  # no temp files
    lines = (out / "predictions.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines], json.loads((out / "summary.json").read_text(encoding="utf-8"))


def test_eval_hotpotqa_on_the_real_fixture(vllm: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = hotpot_records(10)
    data = tmp_path / "hotpot_dev_sample.json"
    data.write_text(json.dumps(records), encoding="utf-8")
    server = vllm(hotpot_script(records))
    searcher = FakeSearcher(HOTPOT_CORPUS)
    out = tmp_path / "run"
    assert eval_hotpotqa.main(hotpot_args(server, data, out), searcher=searcher) == 0

    predictions, summary = read_run(out)
    assert [p["id"] for p in predictions] == [r["_id"] for r in records]
    got = [(p["prediction"], p["em"], p["f1"], p["ending"], p["turns"], p["searches"]) for p in predictions]
    assert got == EXPECTED_HOTPOT
    first = predictions[0]
    assert first["gold"] == ["a spirit"] and first["question"] == records[0]["question"].strip()
    assert first["queries"] == ["Gallu demon"] and first["failed_searches"] == 0
    assert first["transcript"] == (
        "<think>Look it up.</think>\n<search>Gallu demon</search>"
        + format_observation(HOTPOT_CORPUS["Gallu demon"], 3000)
        + "<answer>Spirit</answer>"
    )
    rambling = predictions[5]["transcript"]
    assert predictions[5]["response_tokens"] == 400 and len(rambling) == 400
    assert rambling.startswith("<think>Let me think about luaus and so on and so on")

    assert summary["questions"] == 10 and summary["em"] == 0.3
    assert summary["f1"] == pytest.approx((1 + 2 / 3 + 1 + 1 + 0.5) / 10, rel=1e-12)
    assert summary["searches_per_question"] == 0.6
    assert summary["endings"] == {"answered": 7, "stopped": 1, "length": 1, "turns": 1}
    assert summary["no_answer"] == 3 and summary["failed_searches"] == 0
    assert summary["settings"]["max_turns"] == 3 and summary["model"] == MODEL

    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == (
        "eval_hotpotqa: 10 questions, EM 0.300, F1 0.417, 0.6 searches/question, "
        "endings answered 7 / stopped 1 / length 1 / turns 1"
    )
    # the probe search, then one call per executed search, each with --topk 3
    assert len(searcher.calls) == 1 + 6 and all(topk == 3 for _, topk in searcher.calls[1:])


def test_eval_hotpotqa_reads_jsonl_rows_and_counts_failed_searches(
    vllm: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "qa.jsonl"
    rows = [{"question": "Who directed Jaws?", "answer": "Steven Spielberg", "answers": ["Spielberg"]}]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    server = vllm({"Who directed Jaws?": search_then("Jaws director", "Spielberg")})
    searcher = FakeSearcher(failing=frozenset({"Jaws director"}))
    out = tmp_path / "run"
    assert eval_hotpotqa.main(hotpot_args(server, data, out), searcher=searcher) == 0
    [prediction], summary = read_run(out)
    assert prediction["id"] == "row-0" and prediction["gold"] == ["Steven Spielberg", "Spielberg"]
    assert prediction["em"] == 1.0 and prediction["failed_searches"] == 1
    assert prediction["errors"] == ["fake retriever: ['Jaws director'] failed"]
    assert "<result>\n</result>" in prediction["transcript"]  # the model was shown an empty result
    assert summary["failed_searches"] == 1
    assert "warning: 1 searches failed" in capsys.readouterr().out


class SlowSearcher(FakeSearcher):
    """Searches that take a while, counting how many are in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = self.most_in_flight = 0

    async def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.05)
            return await super().search(queries, topk)
        finally:
            self.in_flight -= 1


def test_episodes_run_concurrently_up_to_the_limit(vllm: Any, tmp_path: Path) -> None:
    questions = [f"Question number {i}?" for i in range(6)]
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": "x"}) + "\n" for q in questions), encoding="utf-8")
    server = vllm({q: search_then(f"query {i}", "x") for i, q in enumerate(questions)})
    searcher = SlowSearcher()
    out = tmp_path / "run"
    assert eval_hotpotqa.main(hotpot_args(server, data, out, "--concurrency", "3"), searcher=searcher) == 0
    assert searcher.most_in_flight == 3
    predictions, summary = read_run(out)
    assert [p["question"] for p in predictions] == questions and summary["em"] == 1.0  # input order kept


def test_an_existing_run_is_kept_unless_forced(vllm: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = hotpot_records(2)
    data = tmp_path / "dev.json"
    data.write_text(json.dumps(records), encoding="utf-8")
    server = vllm(hotpot_script(hotpot_records(10)))
    out = tmp_path / "run"
    assert eval_hotpotqa.main(hotpot_args(server, data, out, "--limit", "1"), searcher=FakeSearcher()) == 0
    before = (out / "summary.json").read_text(encoding="utf-8")
    capsys.readouterr()
    assert eval_hotpotqa.main(hotpot_args(server, data, out), searcher=FakeSearcher()) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"{out / 'predictions.jsonl'} already exists; pass --force" in error
    assert (out / "summary.json").read_text(encoding="utf-8") == before
    assert eval_hotpotqa.main(hotpot_args(server, data, out, "--force"), searcher=FakeSearcher()) == 0
    predictions, summary = read_run(out)
    assert summary["questions"] == 2 and len(predictions) == 2


# ================================================================ eval_gaia end to end (synthetic rows)


def gaia_rows() -> list[dict[str, Any]]:
    """Synthetic GAIA rows (invented questions, the real field names)."""

    def row(task: str, question: str, level: int, answer: str, file_name: str = "") -> dict[str, Any]:
        return {
            "task_id": task,
            "Question": question,
            "Level": level,
            "Final answer": answer,
            "file_name": file_name,
            "Annotator Metadata": {"Steps": "1. made up for the tests"},
        }

    return [
        row("t1", "What did the widget cost?", 1, "1000"),
        row("t2", "What share was it?", 1, "3.5"),
        row("t3", "Which colours, in order?", 1, "red, green; blue"),
        row("t4", "Which fruits?", 1, "apple, banana"),
        row("t5", "Which band is in the picture?", 1, "The Beatles", "t5.png"),
        row("t6", "Which bird?", 2, "Sea gull"),
        row("t7", "Which city?", 1, "Paris"),
    ]


GAIA_SCRIPT = {
    "What did the widget cost?": search_then("widget price", "$1,000"),  # number rule: right
    "What share was it?": [Reply("<answer>3.5%</answer>")],  # number rule: right
    "Which colours, in order?": [Reply("<answer>Red,green;Blue</answer>")],  # list rule: right
    "Which fruits?": [Reply("<answer>apple</answer>")],  # list of another length: wrong, counted
    "Which band is in the picture?": [Reply("<answer>Beatles</answer>")],  # articles kept: wrong
    "Which bird?": [Reply("<answer>seagull</answer>")],  # whitespace removed: right
    "Which city?": [Reply("No idea.", eos=True)],  # no answer: wrong
}


def write_gaia(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(list(rows)), path)
    else:  # Level as text in the jsonl, as an integer in the parquet: both occur
        path.write_text("".join(json.dumps({**r, "Level": str(r["Level"])}) + "\n" for r in rows), encoding="utf-8")
    return path


def gaia_args(server: ScriptedVLLM, data: Path, out: Path, *extra: str) -> list[str]:
    return ["--data", str(data), "--endpoint", server.base_url, "--model", MODEL, "--out", str(out), *extra]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_eval_gaia_level_one_whole_and_text_only(
    vllm: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], suffix: str
) -> None:
    data = write_gaia(tmp_path / f"metadata{suffix}", gaia_rows())
    server = vllm(GAIA_SCRIPT)
    out = tmp_path / "run"
    assert eval_gaia.main(gaia_args(server, data, out), searcher=FakeSearcher()) == 0
    predictions, summary = read_run(out)
    got = [(p["id"], p["prediction"], p["correct"], p["answer_kind"], p["file_name"]) for p in predictions]
    assert got == [
        ("t1", "$1,000", True, "number", ""),
        ("t2", "3.5%", True, "number", ""),
        ("t3", "Red,green;Blue", True, "list", ""),
        ("t4", "apple", False, "list", ""),
        ("t5", "Beatles", False, "string", "t5.png"),
        ("t7", None, False, "string", ""),
    ]
    assert [p["list_length_mismatch"] for p in predictions] == [False, False, False, True, False, False]
    assert all(p["level"] == 1 for p in predictions) and predictions[0]["searches"] == 1
    assert summary["level"] == 1 and summary["rows_read"] == 7
    assert (summary["questions"], summary["correct"], summary["accuracy"]) == (6, 3, 0.5)
    assert summary["text_only"] == {"questions": 5, "correct": 3, "accuracy": 0.6}
    assert summary["with_file"] == 1 and summary["list_length_mismatches"] == 1
    assert summary["endings"] == {"answered": 5, "stopped": 1, "length": 0, "turns": 0}
    assert capsys.readouterr().out.splitlines()[0] == (
        "eval_gaia: level 1, 6 questions, accuracy 0.500 (3/6); text-only 5 questions, accuracy 0.600 (3/5); "
        "0.2 searches/question, endings answered 5 / stopped 1 / length 0 / turns 0; list length mismatches 1"
    )


def test_eval_gaia_level_two(vllm: Any, tmp_path: Path) -> None:
    data = write_gaia(tmp_path / "metadata.parquet", gaia_rows())
    server = vllm(GAIA_SCRIPT)
    out = tmp_path / "run"
    assert eval_gaia.main(gaia_args(server, data, out, "--level", "2"), searcher=FakeSearcher()) == 0
    [prediction], summary = read_run(out)
    assert prediction["id"] == "t6" and prediction["correct"] is True and prediction["level"] == 2
    assert (summary["questions"], summary["correct"], summary["accuracy"]) == (1, 1, 1.0)
    assert summary["text_only"] == {"questions": 1, "correct": 1, "accuracy": 1.0}
    assert [body["messages"][1]["content"] for body in server.requests] == ["Question: Which bird?"]


# ================================================================ bad input: one line, non-zero, no traceback


def run_module(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0]


def test_a_missing_data_file(tmp_path: Path) -> None:
    missing = tmp_path / "hotpot_dev_distractor_v1.json"
    result = run_module("recipe.eval_hotpotqa", "--data", str(missing), "--model", MODEL, "--out", str(tmp_path))
    assert_one_line_error(result, 2, f"--data {missing} does not exist", "eval_hotpotqa: error:")


def test_an_unreachable_endpoint(tmp_path: Path) -> None:
    data = tmp_path / "dev.json"
    data.write_text(json.dumps(hotpot_records(1)), encoding="utf-8")
    url = f"http://127.0.0.1:{free_port()}/v1"
    result = run_module(
        "recipe.eval_hotpotqa", "--data", str(data), "--endpoint", url, "--model", MODEL,
        "--out", str(tmp_path / "run"), "--retries", "0",
    )  # fmt: skip
    assert_one_line_error(result, 1, f"{url}/models: cannot reach it", "after 1 attempts")
    assert not (tmp_path / "run").exists()


def test_a_malformed_gaia_row_names_its_line(tmp_path: Path) -> None:
    rows = gaia_rows()
    del rows[1]["Final answer"]
    data = write_gaia(tmp_path / "metadata.jsonl", rows)
    result = run_module("recipe.eval_gaia", "--data", str(data), "--model", MODEL, "--out", str(tmp_path / "run"))
    assert_one_line_error(result, 2, f"{data} line 2: no 'Final answer'")


def test_malformed_json_lines_and_bad_levels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "qa.jsonl"
    broken.write_text('{"question": "q", "answer": "a"}\n{"question": \n', encoding="utf-8")
    args = ["--model", MODEL, "--out", str(tmp_path / "run")]
    assert eval_hotpotqa.main(["--data", str(broken), *args], searcher=FakeSearcher()) == 2
    assert f"{broken} line 2: not valid JSON" in capsys.readouterr().err
    rows = gaia_rows()
    rows[2]["Level"] = 4
    data = write_gaia(tmp_path / "metadata.parquet", rows)
    assert eval_gaia.main(["--data", str(data), *args], searcher=FakeSearcher()) == 2
    assert f"{data} row 2: 'Level' must be 1, 2 or 3, got 4" in capsys.readouterr().err


def test_a_model_the_endpoint_does_not_serve(vllm: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_gaia(tmp_path / "metadata.jsonl", gaia_rows())
    server = vllm(GAIA_SCRIPT, model="Qwen/Qwen2.5-7B-Instruct")
    code = eval_gaia.main(gaia_args(server, data, tmp_path / "run"), searcher=FakeSearcher())
    error = capsys.readouterr().err
    assert code == 1 and error.count("\n") == 1
    assert f"does not serve model '{MODEL}' (it serves: Qwen/Qwen2.5-7B-Instruct)" in error
    assert server.requests == []


def test_a_dead_retriever_stops_the_run_before_the_first_episode(
    vllm: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_gaia(tmp_path / "metadata.jsonl", gaia_rows())
    server = vllm(GAIA_SCRIPT)
    dead = FakeSearcher(failing=frozenset({"What did the widget cost?"}))
    assert eval_gaia.main(gaia_args(server, data, tmp_path / "run"), searcher=dead) == 1
    assert "fake retriever" in capsys.readouterr().err and server.requests == []


def test_an_endpoint_failing_mid_run_writes_nothing(
    vllm: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_gaia(tmp_path / "metadata.jsonl", gaia_rows())
    server = vllm(GAIA_SCRIPT)
    server.queued += [(500, json.dumps({"object": "error", "message": "CUDA out of memory"}))] * 2
    out = tmp_path / "run"
    code = eval_gaia.main(gaia_args(server, data, out, "--retries", "1", "--concurrency", "1"), searcher=FakeSearcher())
    assert code == 1 and "HTTP 500: CUDA out of memory after 2 attempts" in capsys.readouterr().err
    assert not out.exists()


def test_eval_hotpotqa_end_to_end_with_the_real_index_and_retrieval_server(
    vllm: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The recipe's own commands in a row: the HotpotQA sample's paragraphs as a corpus, ``recipe.search.index``,
    ``recipe.search.server`` on loopback, and ``recipe.eval_hotpotqa`` whose scripted model searches through it."""
    records = hotpot_records(2)
    data = tmp_path / "hotpot_dev_sample.json"
    data.write_text(json.dumps(records), encoding="utf-8")
    corpus, index = tmp_path / "corpus.jsonl", tmp_path / "index"
    converted = run_module("recipe.search.hotpot_corpus", "--hotpotqa", str(HOTPOT_FIXTURE), "--out", str(corpus))
    assert converted.returncode == 0, converted.stderr
    built = run_module("recipe.search.index", "--corpus", str(corpus), "--out", str(index), "--no-progress")
    assert built.returncode == 0, built.stderr
    script = {
        str(records[0]["question"]).strip(): search_then("Lilu mythology demon spirit", "a spirit"),
        str(records[1]["question"]).strip(): [Reply("<answer>yes</answer>")],
    }
    out = tmp_path / "run"
    with RetrievalServer(index) as retriever:
        # three real passages are ~2,000 characters: a budget that holds them (the default is 4096 tokens)
        args = [*hotpot_args(vllm(script), data, out), "--max-response-tokens", "4096"]
        assert eval_hotpotqa.main([*args, "--retrieval-url", retriever.url]) == 0
    # its stop line says what it served: the preflight search and the episode's one
    assert re.search(r"search-server: served requests=2 queries=2 engine_calls=2 ", retriever.log), retriever.log
    predictions, summary = read_run(out)
    first = predictions[0]
    assert first["queries"] == ["Lilu mythology demon spirit"] and first["failed_searches"] == 0
    assert "Doc 1 (Title: Lilu (mythology))" in first["transcript"]  # a supporting paragraph of the question
    assert first["em"] == 1.0 and summary["questions"] == 2 and summary["em"] == 1.0  # the second gold is "yes"
    assert capsys.readouterr().out.startswith("eval_hotpotqa: 2 questions, EM 1.000")
