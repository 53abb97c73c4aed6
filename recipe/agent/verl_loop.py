"""The search agent inside verl 0.9.1's agent loop: ``agent_name = "search_agent"``.

verl instantiates one agent loop per trajectory with ``hydra.utils.instantiate(config=<registry entry>,
trainer_config=…, server_manager=…, tokenizer=…, …)`` (``verl/experimental/agent_loop/agent_loop.py:682-693``); the
entry comes from ``@register`` below or from ``rollout.agent.agent_loop_config_path`` (``recipe/configs/
agent_loops.yaml``), whose extra keys (``retrieval_url``, ``topk``, ``max_turns``, ``max_result_chars``,
``retrieval_timeout_s``) arrive here as keyword arguments.

The turn loop is :func:`recipe.agent.episode.run_episode`, shared with evaluation. This module is its token-level
:class:`~recipe.agent.episode.Transcript`: every turn asks verl's LLM server to continue the prompt plus the response
so far (one sticky request id per trajectory), cuts the returned tokens at the first stop string itself (vLLM
honours ``stop``, other engines may run past it), and appends observations as masked tokens, Search-R1 style: the
whole episode is one assistant message, so ``response_ids`` is what the model wrote and what the retriever
answered, in order, and decodes to the text the reward reads.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register
from verl.utils.rollout_trace import rollout_trace_op
from verl.workers.rollout.replica import TokenOutput

from recipe.agent.episode import Episode, EpisodeLimits, Searcher, Turn, TurnEnd, run_episode
from recipe.search.client import DEFAULT_RETRIEVAL_URL, RetrievalClient

logger = logging.getLogger(__name__)

AGENT_NAME = "search_agent"
DEFAULT_RETRIEVAL_TIMEOUT_S = 30.0

# the keys every trajectory adds to extra_fields (verl turns each into one array over the batch and hands them to
# the reward as extra_info, verl/experimental/agent_loop/agent_loop.py:1016 and :1129-1133): always all of them
EXTRA_KEYS = ("turn_scores", "tool_rewards", "num_searches", "num_failed_searches", "num_invalid_turns", "ending")


# --- the retrieval client, shared by the trajectories of one worker process ---------------------------------------

SearcherFactory = Callable[[str, float], Searcher]


def retrieval_client(url: str, timeout_s: float) -> Searcher:
    """The HTTP client of the retrieval server at ``url`` (the full /retrieve URL)."""
    return RetrievalClient(url, timeout_s=timeout_s)


_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, float], Searcher]] = (
    weakref.WeakKeyDictionary()
)


def shared_searcher(url: str, timeout_s: float, factory: SearcherFactory = retrieval_client) -> Searcher:
    """The searcher for ``url`` on the running event loop, made by ``factory`` on first use. verl makes one agent
    loop per trajectory, all on the worker's one event loop: they share one client (and its connection pool). An
    HTTP client is bound to the loop it was made on, so another loop gets its own; a closed loop's entry goes with
    the loop."""
    loop = asyncio.get_running_loop()
    per_loop = _clients.setdefault(loop, {})
    key = (url, float(timeout_s))
    if key not in per_loop:
        per_loop[key] = factory(url, float(timeout_s))
    return per_loop[key]


# --- the token transcript -----------------------------------------------------------------------------------------


def _contains_stop(text: str, stop: Sequence[str]) -> bool:
    return any(s in text for s in stop)


class EngineOutputError(RuntimeError):
    """The LLM server answered something the transcript cannot use; the message names the request and what."""


def first_stop_prefix(
    token_ids: Sequence[int], decode: Callable[[Sequence[int]], str], stop: Sequence[str]
) -> tuple[int, bool]:
    """(length of the shortest prefix of ``token_ids`` whose decoded text contains one of ``stop``, True), or
    ``(len(token_ids), False)`` when none does. Containing a stop string is monotone in the prefix length (decoding
    more tokens only appends text), so a binary search needs O(log n) decodes."""
    if not stop or not _contains_stop(decode(token_ids), stop):
        return len(token_ids), False
    low, high = 1, len(token_ids)  # the full sequence contains a stop string
    while low < high:
        middle = (low + high) // 2
        if _contains_stop(decode(token_ids[:middle]), stop):
            high = middle
        else:
            low = middle + 1
    return low, True


@dataclass
class TokenTranscript:
    """The prompt and the response of one trajectory as token ids, with verl's loss mask and rollout log-probs.

    Model tokens get mask 1 and the engine's log-probs; observation tokens mask 0 and log-prob 0.0. The response
    never grows past ``response_length``."""

    server_manager: Any  # verl's LLMServerClient: async generate(request_id, *, prompt_ids, sampling_params, …)
    tokenizer: Any
    prompt_ids: list[int]
    sampling_params: dict[str, Any]
    response_length: int
    request_id: str
    clock: Callable[[], float] = time.monotonic
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    engine_logprobs: bool | None = None  # unknown until the engine answers with tokens
    generations: int = 0  # engine calls
    observations: int = 0  # observations appended
    generate_seconds: float = 0.0
    num_preempted: int | None = None
    engine_extra_fields: dict[str, Any] = field(default_factory=dict)

    @property
    def budget(self) -> int:
        return self.response_length - len(self.response_ids)

    def _decode(self, token_ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=True))

    async def generate(self, stop: Sequence[str]) -> Turn:
        budget = self.budget
        if budget <= 0:  # the engine would still make one token (vLLM clamps max_tokens to >= 1)
            return Turn("", TurnEnd.LENGTH)
        params = {**self.sampling_params, "max_tokens": budget}
        if stop:
            params["stop"] = list(stop)
        started = self.clock()
        output: TokenOutput = await self.server_manager.generate(
            request_id=self.request_id, prompt_ids=self.prompt_ids + self.response_ids, sampling_params=params
        )
        self.generate_seconds += self.clock() - started
        self.generations += 1
        self._note_engine(output)
        tokens = [int(token) for token in output.token_ids]
        logprobs = self._logprobs_of(output, len(tokens))
        kept, stopped = first_stop_prefix(tokens, self._decode, stop)
        if kept > budget:  # an engine that ignores max_tokens still cannot overflow the response
            kept, stopped = budget, False
        tokens = tokens[:kept]
        self.response_ids += tokens
        self.response_mask += [1] * kept
        self.response_logprobs += logprobs[:kept] if logprobs is not None else [0.0] * kept
        return Turn(self._decode(tokens), self._end(tokens, stopped, budget, output.stop_reason))

    def _end(self, tokens: list[int], stopped: bool, budget: int, stop_reason: str | None) -> TurnEnd:
        if stopped:
            return TurnEnd.STOP
        if tokens and tokens[-1] == self.tokenizer.eos_token_id:
            return TurnEnd.EOS
        if len(tokens) >= budget or stop_reason == "length":
            return TurnEnd.LENGTH
        # the engine ended the message on its own (another stop token, e.g. <|endoftext|>, or an abort)
        return TurnEnd.EOS

    def _logprobs_of(self, output: TokenOutput, n_tokens: int) -> list[float] | None:
        if n_tokens == 0:
            return None
        has_logprobs = bool(output.log_probs)
        if self.engine_logprobs is None:
            self.engine_logprobs = has_logprobs
        elif self.engine_logprobs != has_logprobs:
            raise EngineOutputError(
                f"request {self.request_id}: the engine returned log-probs on some turns and not on others "
                f"(turn {self.generations}: {'with' if has_logprobs else 'without'})"
            )
        if not has_logprobs:
            return None
        assert output.log_probs is not None
        if len(output.log_probs) != n_tokens:
            raise EngineOutputError(
                f"request {self.request_id}: {n_tokens} tokens but {len(output.log_probs)} log-probs "
                f"(turn {self.generations})"
            )
        return [float(value) for value in output.log_probs]

    def _note_engine(self, output: TokenOutput) -> None:
        if output.num_preempted is not None:
            self.num_preempted = (self.num_preempted or 0) + output.num_preempted
        if not self.engine_extra_fields:  # as verl's tool agent: the first answer's fields, the latest weights
            self.engine_extra_fields = dict(output.extra_fields)
        elif output.extra_fields.get("max_global_steps") is not None:
            self.engine_extra_fields["max_global_steps"] = output.extra_fields["max_global_steps"]

    def observe(self, text: str) -> bool:
        """Append ``text`` as masked tokens; False, appending nothing, when it does not fit the response budget.
        Not truncated: no model token could follow it (the budget would be spent), so a cut observation would only
        add masked, untrained tokens, and it could end inside a tag or a multi-byte character."""
        ids = [int(token) for token in self.tokenizer.encode(text, add_special_tokens=False)]
        if len(ids) > self.budget:
            return False
        self.response_ids += ids
        self.response_mask += [0] * len(ids)
        self.response_logprobs += [0.0] * len(ids)
        self.observations += 1
        return True

    @property
    def logprobs(self) -> list[float] | None:
        """The rollout log-probs aligned with ``response_ids``, or None when the engine returned none."""
        return list(self.response_logprobs) if self.engine_logprobs else None


# --- the agent loop -----------------------------------------------------------------------------------------------


def extra_fields_of(episode: Episode) -> dict[str, Any]:
    """The per-trajectory fields verl carries to the batch and the reward's extra_info, with the keys of verl's tool
    agent (``turn_scores``, ``tool_rewards``: one 0.0 per search, the native tool's reward) and the episode's counts;
    exactly ``EXTRA_KEYS``, whatever happened."""
    fields = {
        "turn_scores": [],
        "tool_rewards": [0.0] * episode.searches,
        "num_searches": episode.searches,
        "num_failed_searches": episode.failed_searches,
        "num_invalid_turns": episode.invalid_turns,
        "ending": episode.ending.value,
    }
    assert tuple(fields) == EXTRA_KEYS
    return fields


@register(AGENT_NAME)
class SearchAgentLoop(AgentLoopBase):
    """verl's agent loop for the search protocol (``<search>`` tags, ``<result>`` observations)."""

    def __init__(
        self,
        *args: Any,
        retrieval_url: str = DEFAULT_RETRIEVAL_URL,
        topk: int = 3,
        max_turns: int = 8,
        max_result_chars: int = 3000,
        retrieval_timeout_s: float = DEFAULT_RETRIEVAL_TIMEOUT_S,
        searcher: Searcher | None = None,
        searcher_factory: SearcherFactory | None = None,
        **kwargs: Any,
    ) -> None:
        """verl's arguments pass through to AgentLoopBase (``tools``, unused: the search is this loop's own, and
        the registry entry's ``name`` are dropped there). ``searcher`` replaces the retrieval client (tests);
        ``searcher_factory(url, timeout_s)`` makes the shared one (default: ``recipe.search.client``)."""
        super().__init__(*args, **kwargs)
        self.limits = EpisodeLimits(max_turns=int(max_turns), topk=int(topk), max_result_chars=int(max_result_chars))
        self.retrieval_url = str(retrieval_url)
        self.retrieval_timeout_s = float(retrieval_timeout_s)
        self._searcher = searcher
        self._searcher_factory = searcher_factory or retrieval_client
        self.response_length = int(self.rollout_config.response_length)

    def searcher(self) -> Searcher:
        if self._searcher is None:
            self._searcher = shared_searcher(self.retrieval_url, self.retrieval_timeout_s, self._searcher_factory)
        return self._searcher

    @rollout_trace_op
    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs: Any) -> AgentLoopOutput:
        messages = list(kwargs["raw_prompt"])
        prompt_ids = await self.ct_build_initial_tokens(messages)
        deterministic = bool(getattr(self.rollout_config, "full_determinism", False))
        transcript = TokenTranscript(
            server_manager=self.server_manager,
            tokenizer=self.tokenizer,
            prompt_ids=list(prompt_ids),
            sampling_params=dict(sampling_params),
            response_length=self.response_length,
            request_id=f"det-{int(priority)}" if deterministic else uuid4().hex,  # as verl's own loops
        )
        episode = await run_episode(transcript, self.searcher(), self.limits)
        if episode.errors:
            logger.warning("search agent: %d failed searches, last: %s", episode.failed_searches, episode.errors[-1])
        assert len(transcript.response_ids) <= self.response_length
        metrics = AgentLoopMetrics(
            generate_sequences=transcript.generate_seconds,
            tool_calls=episode.search_seconds,
            num_preempted=-1 if transcript.num_preempted is None else transcript.num_preempted,
        )
        return AgentLoopOutput(
            prompt_ids=transcript.prompt_ids,
            response_ids=transcript.response_ids,
            response_mask=transcript.response_mask,
            response_logprobs=transcript.logprobs,
            # verl's count: the prompt, each model turn, each observation (tool_agent_loop.py:203)
            num_turns=1 + transcript.generations + transcript.observations,
            metrics=metrics,
            extra_fields={**transcript.engine_extra_fields, **extra_fields_of(episode)},
        )
