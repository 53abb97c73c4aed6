"""The evaluation driver of the turn loop: a text :class:`~recipe.agent.episode.Transcript` over an
OpenAI-compatible ``/v1/chat/completions`` endpoint as ``vllm serve <checkpoint>`` serves it.

The conversation sent on every turn is ``build_messages(question)`` plus ONE assistant message holding everything
written so far (the model's text and the ``<result>`` observations), which the model continues::

    {"messages": [system, user, {"role": "assistant", "content": <transcript so far>}],
     "continue_final_message": true, "add_generation_prompt": false,
     "stop": ["</search>", "</answer>"], "include_stop_str_in_output": true,
     "max_tokens": <response budget left>, "temperature": 0.0}

vLLM's API, as checked (docs.vllm.ai/en/stable/serving/openai_compatible_server/, "Extra parameters" of the Chat
API, which reproduces ``ChatCompletionRequest`` of ``vllm/entrypoints/openai/protocol.py``):

* ``continue_final_message`` (default false): "the chat will be formatted so that the final message in the chat
  is open-ended, without any EOS tokens. The model will continue this message rather than starting a new one …
  Cannot be used at the same time as ``add_generation_prompt``" — whose default is true, hence the explicit
  ``add_generation_prompt: false``. ``echo`` stays false, so the reply holds only the continuation.
* ``include_stop_str_in_output`` (default false) is a sampling parameter of the Chat API: with it the reply ends
  with the matched ``</search>`` / ``</answer>``, which ``parse_action`` needs.
* the reply's ``choices[0].stop_reason`` (vLLM extension, PR vllm-project/vllm#2976; ``ChatCompletionResponseChoice``
  ``stop_reason: int | str | None``) is "the stop string or token id that caused the completion to stop, None if
  the completion finished for some other reason including encountering the EOS token". So ``finish_reason``
  ``"length"`` → LENGTH; ``"stop"`` with a stop string (or a text ending with one) → STOP; ``"stop"`` otherwise
  → EOS.

Response budget (what verl's ``data.max_response_length`` bounds in training: the model's tokens *and* the
observations'): ``max_response_tokens`` tokens per episode. The model's tokens are counted exactly from
``usage.completion_tokens``. An observation's tokens are not known when it is appended (no tokenizer here), so it
is charged an estimate, ``ceil(len(text) / chars_per_token)`` (3 characters per token by default: an over-estimate
for English BPE, so the budget errs on the short side); the next reply replaces every estimate by the measured
size of the assistant message, ``usage.prompt_tokens`` minus the first request's (whose assistant message was
empty), when the endpoint reports it. ``max_tokens`` of each request is the budget left.

Caveat: Hugging Face's ``apply_chat_template(continue_final_message=True)``, which vLLM uses, locates the final
message's content *stripped* of surrounding whitespace, so the ``\\n\\n`` that closes an observation is not in the
prompt the model continues (training's token ids do hold it). The transcript keeps the text as written.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from recipe.agent.episode import Turn, TurnEnd
from recipe.agent.protocol import cut_at_stop
from recipe.prompt import build_messages

DEFAULT_MAX_RESPONSE_TOKENS = 4096
DEFAULT_CHARS_PER_TOKEN = 3.0
RETRY_STATUS_MIN = 500  # 5xx answers are retried; 4xx are the request's fault and are not


class EndpointError(Exception):
    """The chat endpoint could not be used: unreachable, an error status, or a reply that is not a chat
    completion. The message names the URL and what was wrong."""


@dataclass(frozen=True, slots=True)
class Completion:
    """The fields of one chat completion the turn loop needs."""

    text: str
    finish_reason: str
    stop_reason: str | int | None
    completion_tokens: int
    prompt_tokens: int | None


def _error_detail(response: httpx.Response) -> str:
    """vLLM's error message (``{"message": …}`` or ``{"error": {"message": …}}``), else the start of the body."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:300] or "(empty body)"
    if isinstance(body, dict):
        inner = body.get("error")
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
        if isinstance(body.get("message"), str):
            return str(body["message"])
        if "detail" in body:
            return str(body["detail"])
    return str(body)[:300]


def parse_completion(body: Any) -> Completion:
    """The :class:`Completion` in a ``/chat/completions`` reply; ValueError naming the first missing or mistyped
    field."""
    if not isinstance(body, dict):
        raise ValueError(f"the reply is a JSON {type(body).__name__}, not an object")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError("no choices[0] in the reply")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict) or "content" not in message:
        raise ValueError("no choices[0].message.content in the reply")
    content = message["content"]
    if content is not None and not isinstance(content, str):
        raise ValueError(f"choices[0].message.content is a {type(content).__name__}, not a string")
    finish_reason = choice.get("finish_reason")
    if not isinstance(finish_reason, str):
        raise ValueError("no choices[0].finish_reason in the reply")
    stop_reason = choice.get("stop_reason")
    if stop_reason is not None and not isinstance(stop_reason, str | int):
        raise ValueError(f"choices[0].stop_reason is a {type(stop_reason).__name__}")
    usage = body.get("usage")
    completion_tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if not isinstance(completion_tokens, int) or completion_tokens < 0:
        raise ValueError("no usage.completion_tokens in the reply (needed for the response budget)")
    prompt_tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return Completion(
        text=content or "",
        finish_reason=finish_reason,
        stop_reason=stop_reason,
        completion_tokens=completion_tokens,
        prompt_tokens=prompt_tokens if isinstance(prompt_tokens, int) else None,
    )


class ChatEndpoint:
    """One OpenAI-compatible server (``base_url`` like ``http://127.0.0.1:8001/v1``) and the model it serves,
    shared by all episodes of a run. Connection errors, timeouts and 5xx answers are retried ``retries`` times
    with exponential backoff from ``backoff_s``; any failure raises :class:`EndpointError`."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        temperature: float = 0.0,
        timeout_s: float = 600.0,
        retries: int = 3,
        backoff_s: float = 0.5,
    ) -> None:
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.temperature = temperature
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self._client: httpx.AsyncClient | None = None

    @property
    def chat_url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _request(self, method: str, url: str, payload: dict[str, Any] | None = None) -> Any:
        attempts = self.retries + 1
        failure = ""
        for attempt in range(1, attempts + 1):
            if attempt > 1:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 2))
            try:
                response = await self._http().request(method, url, json=payload)
            except httpx.TransportError as error:
                failure = f"cannot reach it ({type(error).__name__}: {error or 'no detail'})"
                continue
            if response.status_code >= RETRY_STATUS_MIN:
                failure = f"HTTP {response.status_code}: {_error_detail(response)}"
                continue
            if response.status_code >= 400:
                raise EndpointError(f"{url}: HTTP {response.status_code}: {_error_detail(response)}")
            try:
                return response.json()
            except ValueError:
                raise EndpointError(f"{url}: the reply is not JSON: {response.text[:200]!r}") from None
        raise EndpointError(f"{url}: {failure} after {attempts} attempts; is the server up?")

    async def complete(self, messages: Sequence[dict[str, str]], stop: Sequence[str], max_tokens: int) -> Completion:
        """Continue the final (assistant) message of ``messages`` for at most ``max_tokens`` tokens."""
        payload = {
            "model": self.model,
            "messages": list(messages),
            "continue_final_message": True,
            "add_generation_prompt": False,
            "stop": list(stop),
            "include_stop_str_in_output": True,
            "max_tokens": max_tokens,
            "temperature": self.temperature,
            "n": 1,
            "stream": False,
        }
        body = await self._request("POST", self.chat_url, payload)
        try:
            return parse_completion(body)
        except ValueError as error:
            raise EndpointError(f"{self.chat_url}: not a chat completion: {error}") from None

    async def served_models(self) -> list[str] | None:
        """The model ids of ``GET /models``, or None when the server has no such route (not every
        OpenAI-compatible server does; vLLM does)."""
        url = f"{self.base_url}/models"
        try:
            body = await self._request("GET", url)
        except EndpointError as error:
            if "HTTP 404" in str(error):
                return None
            raise
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise EndpointError(f"{url}: expected {{'data': [{{'id': …}}, …]}}, got {str(body)[:200]}")
        return [str(entry.get("id")) for entry in data if isinstance(entry, dict)]


def turn_end(completion: Completion, text: str, stop: Sequence[str]) -> TurnEnd:
    """How a generation stopped: ``finish_reason`` "length" → LENGTH; "stop" on one of ``stop`` (vLLM's
    ``stop_reason``, or ``text`` ending with it) → STOP; "stop" otherwise (end of sequence) → EOS."""
    if completion.finish_reason == "length":
        return TurnEnd.LENGTH
    if completion.finish_reason != "stop":
        raise ValueError(f"unexpected finish_reason {completion.finish_reason!r}")
    stripped = text.rstrip()
    if completion.stop_reason in stop or any(stripped.endswith(s) for s in stop):
        return TurnEnd.STOP
    return TurnEnd.EOS


class ChatTranscript:
    """The :class:`~recipe.agent.episode.Transcript` of one question over a :class:`ChatEndpoint`. ``full_text``
    is the assistant's whole response — model text and observations — which the reward would score."""

    def __init__(
        self,
        endpoint: ChatEndpoint,
        question: str,
        *,
        max_response_tokens: int = DEFAULT_MAX_RESPONSE_TOKENS,
        chars_per_token: float = DEFAULT_CHARS_PER_TOKEN,
    ) -> None:
        if max_response_tokens < 1 or chars_per_token <= 0:
            raise ValueError(
                f"max_response_tokens must be >= 1 and chars_per_token > 0, got {max_response_tokens}, "
                f"{chars_per_token}"
            )
        self.endpoint = endpoint
        self.question = question
        self.max_response_tokens = max_response_tokens
        self.chars_per_token = chars_per_token
        self._text = ""
        self._used = 0  # response tokens so far: measured, plus estimates for observations not yet measured
        self._base_prompt_tokens: int | None = None  # prompt tokens with an empty assistant message
        self.requests = 0

    @property
    def full_text(self) -> str:
        return self._text

    @property
    def tokens_used(self) -> int:
        return self._used

    @property
    def tokens_left(self) -> int:
        return max(self.max_response_tokens - self._used, 0)

    def messages(self) -> list[dict[str, str]]:
        """What the next request sends: the prompt, then the assistant message so far."""
        return [*build_messages(self.question), {"role": "assistant", "content": self._text}]

    async def generate(self, stop: Sequence[str]) -> Turn:
        if self.tokens_left == 0:
            return Turn("", TurnEnd.LENGTH)
        measured_before = self._used
        was_empty = not self._text
        completion = await self.endpoint.complete(self.messages(), stop, self.tokens_left)
        self.requests += 1
        if completion.prompt_tokens is not None:
            if was_empty:
                self._base_prompt_tokens = completion.prompt_tokens
            elif self._base_prompt_tokens is not None:
                measured_before = completion.prompt_tokens - self._base_prompt_tokens
        self._used = measured_before + completion.completion_tokens
        text = cut_at_stop(completion.text)
        try:
            end = turn_end(completion, text, stop)
        except ValueError as error:
            raise EndpointError(f"{self.endpoint.chat_url}: {error}") from None
        self._text += text
        return Turn(text, end)

    def observe(self, text: str) -> bool:
        cost = math.ceil(len(text) / self.chars_per_token)
        if self._used + cost > self.max_response_tokens:
            return False
        self._text += text
        self._used += cost
        return True
