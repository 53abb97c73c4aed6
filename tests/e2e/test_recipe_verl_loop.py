"""recipe.agent.verl_loop (the search agent in verl 0.9.1's agent loop) and recipe.agent.search_tool (the native tool
for verl's tool_agent), against a scripted stand-in for verl's LLM server, a fake searcher and the tiny search
tokenizer of gpu.tiny. Needs torch, transformers and verl with its import chain (CI installs them)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import RetrievalServer

NEEDED = ("torch", "transformers", "tokenizers", "hydra", "verl", "PIL", "datasets")
MISSING = [name for name in NEEDED if importlib.util.find_spec(name) is None]
if MISSING:
    if os.environ.get("CI"):
        raise ImportError(f"tests/e2e/test_recipe_verl_loop.py needs {', '.join(MISSING)} in CI")
    pytest.skip(f"needs {', '.join(MISSING)}", allow_module_level=True)

# verl imports Ray's state API from its old place; the warning is Ray's, not the recipe's
pytestmark = pytest.mark.filterwarnings("ignore:Ray state API is no longer experimental:DeprecationWarning")

import hydra.utils  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Ray state API is no longer experimental", DeprecationWarning)
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopWorker,
        DictConfigWrap,
        ToolListWrap,
        _agent_loop_registry,
    )
from verl.tools.tool_registry import initialize_tools_from_config  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from gpu import tiny  # noqa: E402
from recipe import reward  # noqa: E402
from recipe.agent import search_tool, verl_loop  # noqa: E402
from recipe.agent.protocol import format_observation, format_passages  # noqa: E402
from recipe.prompt import build_messages  # noqa: E402
from recipe.search.passage import Passage, RetrievalError  # noqa: E402

PASSAGES = [
    Passage("1", "Paris", "Paris is the capital and largest city of France.", 12.5),
    Passage("2", "France", "France is a country in Western Europe; its capital is Paris.", 9.0),
]
QUESTION = "What is the capital of France?"
GROUND_TRUTH = {"target": ["Paris"]}
REPO = Path(__file__).resolve().parents[2]
HOTPOT = REPO / "tests" / "fixtures" / "recipe" / "hotpotqa_train_100.json"


# --- stand-ins ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    root = tiny.build_search(tmp_path_factory.mktemp("tiny-search")).root
    return AutoTokenizer.from_pretrained(root / "model")


@dataclass
class Step:
    """One scripted engine answer: ``pieces`` tokenized one by one (a piece may be a single character of a tag, so
    the tag is split across tokens), then eos when ``eos``."""

    pieces: Sequence[str]
    eos: bool = False


@dataclass
class Call:
    request_id: str
    prompt_ids: list[int]
    sampling_params: dict[str, Any]
    returned: list[int]
    logprobs: list[float]


class ScriptedServer:
    """verl's LLM server client, scripted: plays one Step per call, honours ``max_tokens`` (as every engine does)
    but not ``stop`` (as the HF test rollout), and gives each token a distinct log-prob. A plain class, as verl's
    client is: hydra.utils.instantiate would turn a dataclass argument into a config."""

    def __init__(self, tokenizer: Any, steps: list[Step], logprobs: bool = True) -> None:
        self.tokenizer = tokenizer
        self.steps = steps
        self.logprobs = logprobs
        self.calls: list[Call] = []
        self._next_logprob = -0.001

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs: Any
    ) -> TokenOutput:
        step = self.steps[len(self.calls)]
        ids: list[int] = []
        for piece in step.pieces:
            ids += self.tokenizer.encode(piece, add_special_tokens=False)
        if step.eos:
            ids.append(self.tokenizer.eos_token_id)
        limit = sampling_params["max_tokens"]
        ids = ids[:limit]
        logprobs = []
        for _ in ids:
            logprobs.append(self._next_logprob)
            self._next_logprob -= 0.001
        self.calls.append(Call(request_id, list(prompt_ids), dict(sampling_params), ids, logprobs))
        return TokenOutput(
            token_ids=ids,
            log_probs=logprobs if self.logprobs else None,
            stop_reason="completed",
            num_preempted=0,
            extra_fields={"global_steps": 3, "min_global_steps": 3, "max_global_steps": 3 + len(self.calls)},
        )


@dataclass
class FakeSearcher:
    passages: list[Passage] = field(default_factory=lambda: list(PASSAGES))
    fail: bool = False
    queries: list[tuple[list[str], int]] = field(default_factory=list)

    async def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        self.queries.append((list(queries), topk))
        if self.fail:
            raise RetrievalError("http://127.0.0.1:9/retrieve: connection refused after 3 attempts")
        return [self.passages[:topk] for _ in queries]


def trainer_config(response_length: int = 400, prompt_length: int = 2048) -> Any:
    return OmegaConf.create(
        {
            "actor_rollout_ref": {"rollout": {"prompt_length": prompt_length, "response_length": response_length}},
            "data": {},
        }
    )


def verl_kwargs(server: Any, tokenizer: Any, config: Any) -> dict[str, Any]:
    """The keyword arguments verl's AgentLoopWorker._run_agent_loop instantiates an agent loop with
    (verl/experimental/agent_loop/agent_loop.py:683-693)."""
    return {
        "trainer_config": DictConfigWrap(config=config),
        "server_manager": server,
        "tokenizer": tokenizer,
        "processor": None,
        "hf_model_type": "qwen2",
        "dataset_cls": RLHFDataset,
        "data_config": DictConfigWrap(config.data),
        "tools": ToolListWrap([]),
    }


SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


async def run_loop(
    tokenizer: Any, steps: list[Step], searcher: FakeSearcher, *, response_length: int = 400, **loop_kwargs: Any
) -> tuple[Any, ScriptedServer, verl_loop.SearchAgentLoop]:
    server = ScriptedServer(tokenizer, steps)
    config = trainer_config(response_length)
    loop = verl_loop.SearchAgentLoop(**verl_kwargs(server, tokenizer, config), searcher=searcher, **loop_kwargs)
    output = await loop.run(dict(SAMPLING), raw_prompt=build_messages(QUESTION))
    return output, server, loop


def decode(tokenizer: Any, ids: Sequence[int], skip: bool = False) -> str:
    return str(tokenizer.decode(list(ids), skip_special_tokens=skip))


def prompt_text(tokenizer: Any) -> str:
    return str(tokenizer.apply_chat_template(build_messages(QUESTION), tokenize=False, add_generation_prompt=True))


def model_spans(mask: Sequence[int]) -> list[tuple[int, int]]:
    spans, start = [], None
    for index, bit in enumerate([*mask, 0]):
        if bit and start is None:
            start = index
        elif not bit and start is not None:
            spans.append((start, index))
            start = None
    return spans


# --- the search agent loop ----------------------------------------------------------------------------------------


def test_search_then_answer_is_one_masked_transcript_that_scores_full(tokenizer: Any) -> None:
    searcher = FakeSearcher()
    steps = [
        Step(["<think>capital</think>", "<search>capital of  France</search>", " and then I ran on"]),
        Step(["<answer>Paris</answer>", "\n"], eos=True),
    ]
    output, server, _ = asyncio.run(run_loop(tokenizer, steps, searcher))

    first = "<think>capital</think><search>capital of  France</search>"
    observation = format_observation(PASSAGES, 3000)
    second = "<answer>Paris</answer>"
    assert decode(tokenizer, output.prompt_ids) == prompt_text(tokenizer)
    assert (
        decode(tokenizer, output.prompt_ids + output.response_ids)
        == prompt_text(tokenizer) + first + observation + second
    )
    assert searcher.queries == [(["capital of France"], 3)]

    # mask 1 exactly on the model's kept tokens, 0 on the observation's
    n_first = len(tokenizer.encode(first, add_special_tokens=False))
    n_obs = len(tokenizer.encode(observation, add_special_tokens=False))
    n_second = len(tokenizer.encode(second, add_special_tokens=False))
    assert output.response_mask == [1] * n_first + [0] * n_obs + [1] * n_second
    assert decode(tokenizer, output.response_ids[n_first : n_first + n_obs]) == observation

    # log-probs: the engine's, token for token, on the model's tokens; 0.0 on the observation's
    first_call, second_call = server.calls
    assert output.response_logprobs == first_call.logprobs[:n_first] + [0.0] * n_obs + second_call.logprobs[:n_second]
    assert len(output.response_logprobs) == len(output.response_ids)

    # every turn continues the prompt plus the response so far, with the budget left and the stop strings
    assert first_call.prompt_ids == output.prompt_ids
    assert second_call.prompt_ids == output.prompt_ids + output.response_ids[: n_first + n_obs]
    assert first_call.sampling_params == {**SAMPLING, "max_tokens": 400, "stop": ["</search>", "</answer>"]}
    assert second_call.sampling_params["max_tokens"] == 400 - n_first - n_obs

    assert output.num_turns == 4  # prompt, model, observation, model
    assert output.extra_fields == {
        "global_steps": 3,  # the engine's, as verl's tool agent keeps them: the first answer's, the latest weights
        "min_global_steps": 3,
        "max_global_steps": 5,
        "turn_scores": [],
        "tool_rewards": [0.0],
        "num_searches": 1,
        "num_failed_searches": 0,
        "num_invalid_turns": 0,
        "ending": "answered",
    }
    assert output.metrics.generate_sequences >= 0.0 and output.metrics.tool_calls >= 0.0

    # the reward on the response as verl decodes it (skip_special_tokens=True, naive.py:55)
    score = reward.compute_score("hotpotqa", decode(tokenizer, output.response_ids, skip=True), GROUND_TRUTH)
    assert score["score"] == pytest.approx(1.0)
    assert (score["format"], score["n_calls"], score["call_success"]) == (1.0, 1, 1.0)


def test_a_stop_string_split_across_tokens_is_cut_at_its_last_token(tokenizer: Any) -> None:
    # "</answer>" written character by character: no single token is the tag
    steps = [Step(["<answer>", "Lyon", *"</answer>", "garbage"], eos=True)]
    output, server, _ = asyncio.run(run_loop(tokenizer, steps, FakeSearcher()))
    assert decode(tokenizer, output.response_ids) == "<answer>Lyon</answer>"
    assert len(output.response_ids) == 1 + 4 + len("</answer>")
    assert output.response_mask == [1] * len(output.response_ids)
    assert output.response_logprobs == server.calls[0].logprobs[: len(output.response_ids)]
    assert output.extra_fields["ending"] == "answered"
    score = reward.compute_score("hotpotqa", decode(tokenizer, output.response_ids, skip=True), GROUND_TRUTH)
    assert (score["correctness"], score["format"]) == (0.0, 1.0)


def test_eos_without_an_answer_ends_the_episode_and_the_eos_is_trained(tokenizer: Any) -> None:
    searcher = FakeSearcher()
    output, _, _ = asyncio.run(run_loop(tokenizer, [Step(["i do not know"], eos=True)], searcher))
    assert decode(tokenizer, output.response_ids) == "i do not know<|im_end|>"
    assert output.response_ids[-1] == tokenizer.eos_token_id and output.response_mask[-1] == 1
    assert output.extra_fields["ending"] == "stopped" and output.num_turns == 2
    assert searcher.queries == []
    score = reward.compute_score("hotpotqa", decode(tokenizer, output.response_ids, skip=True), GROUND_TRUTH)
    assert score["score"] == 0.0


def test_failed_retrieval_shows_an_empty_result_and_the_episode_goes_on(tokenizer: Any) -> None:
    searcher = FakeSearcher(fail=True)
    steps = [Step(["<search>capital of france</search>"]), Step(["<answer>Paris</answer>"])]
    output, _, _ = asyncio.run(run_loop(tokenizer, steps, searcher))
    text = decode(tokenizer, output.response_ids)
    assert text == "<search>capital of france</search>" + format_observation([], 3000) + "<answer>Paris</answer>"
    assert output.extra_fields["num_failed_searches"] == 1 and output.extra_fields["ending"] == "answered"
    score = reward.compute_score("hotpotqa", decode(tokenizer, output.response_ids, skip=True), GROUND_TRUTH)
    assert (score["correctness"], score["n_calls"], score["call_success"]) == (1.0, 1, 0.0)


def test_max_turns_stops_before_a_search_the_last_turn_asks_for(tokenizer: Any) -> None:
    searcher = FakeSearcher()
    steps = [Step(["<search>one</search>"]), Step(["<search>two</search>"])]
    output, server, _ = asyncio.run(run_loop(tokenizer, steps, searcher, max_turns=2))
    assert len(server.calls) == 2 and searcher.queries == [(["one"], 3)]
    assert output.extra_fields["ending"] == "turns" and output.extra_fields["num_searches"] == 1
    assert decode(tokenizer, output.response_ids).endswith("<search>two</search>")


def test_the_response_never_passes_response_length(tokenizer: Any) -> None:
    # a generation cut by max_tokens: the budget is spent exactly
    output, server, _ = asyncio.run(run_loop(tokenizer, [Step(["x" * 500])], FakeSearcher(), response_length=60))
    assert len(output.response_ids) == 60 and server.calls[0].sampling_params["max_tokens"] == 60
    assert output.extra_fields["ending"] == "length"

    # an observation that does not fit is dropped whole: the response ends on the model's search
    steps = [Step(["<search>capital of france</search>"])]
    output, server, _ = asyncio.run(run_loop(tokenizer, steps, FakeSearcher(), response_length=40))
    assert decode(tokenizer, output.response_ids) == "<search>capital of france</search>"
    assert output.response_mask == [1] * len(output.response_ids) and len(server.calls) == 1
    assert output.extra_fields["ending"] == "length" and output.num_turns == 2

    # an observation that fills the budget exactly leaves nothing to generate: no engine call with max_tokens 0
    query = "<search>capital of france</search>"
    fits = len(tokenizer.encode(query + format_observation(PASSAGES[:1], 3000), add_special_tokens=False))
    steps = [Step([query]), Step(["never"])]
    output, server, _ = asyncio.run(run_loop(tokenizer, steps, FakeSearcher(), response_length=fits, topk=1))
    assert len(output.response_ids) == fits and len(server.calls) == 1
    assert output.extra_fields["ending"] == "length"


def test_one_sticky_request_id_per_trajectory(tokenizer: Any) -> None:
    steps = [Step(["<search>a</search>"]), Step(["<search>b</search>"]), Step(["<answer>c</answer>"])]
    _, first, _ = asyncio.run(run_loop(tokenizer, steps, FakeSearcher()))
    _, second, _ = asyncio.run(run_loop(tokenizer, steps, FakeSearcher()))
    assert len({call.request_id for call in first.calls}) == 1
    assert len({call.request_id for call in second.calls}) == 1
    assert first.calls[0].request_id != second.calls[0].request_id


def test_without_engine_log_probs_the_output_has_none(tokenizer: Any) -> None:
    async def scenario() -> Any:
        server = ScriptedServer(tokenizer, [Step(["<answer>Paris</answer>"])], logprobs=False)
        loop = verl_loop.SearchAgentLoop(**verl_kwargs(server, tokenizer, trainer_config()), searcher=FakeSearcher())
        return await loop.run(dict(SAMPLING), raw_prompt=build_messages(QUESTION))

    assert asyncio.run(scenario()).response_logprobs is None


def test_first_stop_prefix_is_the_shortest_prefix_holding_a_stop_string(tokenizer: Any) -> None:
    def dec(ids: Sequence[int]) -> str:
        return decode(tokenizer, ids, skip=True)

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    ids = encode("ab") + [i for char in "</search>" for i in encode(char)] + encode("cd</answer>")
    assert verl_loop.first_stop_prefix(ids, dec, ("</search>", "</answer>")) == (len("ab</search>"), True)
    assert verl_loop.first_stop_prefix(ids, dec, ("</think>",)) == (len(ids), False)
    assert verl_loop.first_stop_prefix([], dec, ("</search>",)) == (0, False)


# --- the path verl takes: registry entry, hydra.utils.instantiate, postprocess into a batch ------------------------


AGENT_LOOPS_YAML = """\
- name: search_agent
  _target_: recipe.agent.verl_loop.SearchAgentLoop
  retrieval_url: "http://127.0.0.1:8000/retrieve"
  topk: 3
  max_turns: 8
  max_result_chars: 3000
  retrieval_timeout_s: 30
"""


def test_registered_and_instantiated_as_verl_does_with_one_shared_client(
    tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _agent_loop_registry["search_agent"] == {"_target_": "recipe.agent.verl_loop.SearchAgentLoop"}
    made: list[tuple[str, float]] = []
    searcher = FakeSearcher()

    def factory(url: str, timeout_s: float) -> FakeSearcher:
        made.append((url, timeout_s))
        return searcher

    monkeypatch.setattr(verl_loop, "retrieval_client", factory)
    (tmp_path / "agent_loops.yaml").write_text(AGENT_LOOPS_YAML)
    entry = OmegaConf.load(tmp_path / "agent_loops.yaml")[0]  # what AgentLoopWorker puts in the registry (:536-539)

    async def two_trajectories() -> list[Any]:
        outputs = []
        for _ in range(2):
            server = ScriptedServer(tokenizer, [Step(["<search>paris</search>"]), Step(["<answer>Paris</answer>"])])
            loop = hydra.utils.instantiate(config=entry, **verl_kwargs(server, tokenizer, trainer_config()))
            assert isinstance(loop, verl_loop.SearchAgentLoop)
            assert (loop.limits.max_turns, loop.limits.topk, loop.limits.max_result_chars) == (8, 3, 3000)
            outputs.append(await loop.run(dict(SAMPLING), raw_prompt=build_messages(QUESTION)))
        return outputs

    outputs = asyncio.run(two_trajectories())
    assert made == [("http://127.0.0.1:8000/retrieve", 30.0)]  # one client for both trajectories of the loop
    assert searcher.queries == [(["paris"], 3), (["paris"], 3)]
    assert all(output.extra_fields["ending"] == "answered" for output in outputs)


def test_verl_postprocess_pads_the_outputs_and_carries_the_extra_fields(tokenizer: Any) -> None:
    """verl's own _agent_loop_postprocess and _postprocess on two trajectories that ended differently."""
    config = trainer_config(response_length=400, prompt_length=1024)
    worker = object.__new__(AgentLoopWorker)  # the attributes the two methods read, without Ray or a model
    worker.config = config
    worker.rollout_config = config.actor_rollout_ref.rollout
    worker.tokenizer = tokenizer
    worker.processor = None
    worker.mm_processor_kwargs = {}
    worker.reward_loop_worker_handles = None
    worker.distillation_enabled = False

    async def batch() -> Any:
        answered = await run_loop(
            tokenizer, [Step(["<search>q</search>"]), Step(["<answer>Paris</answer>"])], FakeSearcher()
        )
        stopped = await run_loop(tokenizer, [Step(["no idea"], eos=True)], FakeSearcher())
        raw_prompt = build_messages(QUESTION)
        padded = [await worker._agent_loop_postprocess(o[0], False, raw_prompt=raw_prompt) for o in (answered, stopped)]
        return answered[0], stopped[0], worker._postprocess(padded)

    answered, stopped, data = asyncio.run(batch())
    assert tuple(data.batch["responses"].shape) == (2, 400) and tuple(data.batch["prompts"].shape) == (2, 1024)
    n = len(answered.response_ids)
    assert data.batch["response_mask"][0, :n].tolist() == answered.response_mask
    assert data.batch["response_mask"][0, n:].sum().item() == 0
    assert data.batch["rollout_log_probs"][0, :n].tolist() == pytest.approx(answered.response_logprobs)
    assert data.non_tensor_batch["__num_turns__"].tolist() == [4, 2]
    assert data.non_tensor_batch["ending"].tolist() == ["answered", "stopped"]
    assert data.non_tensor_batch["num_searches"].tolist() == [1, 0]
    assert data.non_tensor_batch["tool_rewards"].tolist() == [[0.0], []]
    assert stopped.extra_fields.keys() == answered.extra_fields.keys()


# --- the native tool ----------------------------------------------------------------------------------------------

TOOL_CONFIG = {
    "type": "native",
    "retrieval_service_url": "http://127.0.0.1:8000/retrieve",
    "topk": 3,
    "timeout": 30,
    "max_result_chars": 3000,
}


def execute(tool: search_tool.SearchTool, parameters: dict[str, Any]) -> tuple[Any, float, dict[str, Any]]:
    async def lifecycle() -> tuple[Any, float, dict[str, Any]]:
        instance_id, created = await tool.create(create_kwargs={"question": QUESTION})
        assert created.is_empty()
        try:
            return await tool.execute(instance_id, parameters)
        finally:
            await tool.release(instance_id)

    return asyncio.run(lifecycle())


def test_search_tool_returns_the_passages_in_search_r1_layout() -> None:
    searcher = FakeSearcher()
    tool = search_tool.SearchTool(dict(TOOL_CONFIG), None, searcher=searcher)
    assert tool.name == "search"
    assert tool.tool_schema.function.parameters.required == ["query"]
    response, score, _ = execute(tool, {"query": "  capital of\nFrance "})
    assert searcher.queries == [(["capital of France"], 3)]
    assert response.text == format_passages(PASSAGES, 3000)
    assert response.text.startswith("Doc 1 (Title: Paris) Paris is the capital") and score == 0.0


def test_search_tool_says_why_on_a_blank_query_a_failure_or_no_passages() -> None:
    searcher = FakeSearcher()
    tool = search_tool.SearchTool(dict(TOOL_CONFIG), None, searcher=searcher)
    for parameters in ({}, {"query": "  "}, {"query": 7}):
        assert execute(tool, parameters)[0].text == search_tool.NO_QUERY_TEXT
    assert searcher.queries == []
    failing = search_tool.SearchTool(dict(TOOL_CONFIG), None, searcher=FakeSearcher(fail=True))
    response, score, _ = execute(failing, {"query": "paris"})
    assert response.text == search_tool.FAILED_TEXT and score == 0.0
    empty = search_tool.SearchTool(dict(TOOL_CONFIG), None, searcher=FakeSearcher(passages=[]))
    assert execute(empty, {"query": "paris"})[0].text == search_tool.NO_RESULTS_TEXT


def test_search_tool_cuts_the_passages_to_max_result_chars() -> None:
    long = [Passage(str(i), f"T{i}", "word " * 100, 1.0) for i in range(3)]
    tool = search_tool.SearchTool({**TOOL_CONFIG, "max_result_chars": 300}, None, searcher=FakeSearcher(long))
    text = execute(tool, {"query": "words"})[0].text
    assert len(text) <= 300 and text.startswith("Doc 1 (Title: T0) word") and text.rstrip().endswith("…")


def test_search_tool_config_errors_name_the_key() -> None:
    with pytest.raises(search_tool.ToolConfigError, match="retrieval_service_url"):
        search_tool.SearchTool({"type": "native"}, None)
    with pytest.raises(search_tool.ToolConfigError, match="topk=0"):
        search_tool.SearchTool({**TOOL_CONFIG, "topk": 0}, None)


@pytest.mark.parametrize("with_schema", [False, True])
def test_verl_tool_registry_loads_the_tool_from_yaml(
    with_schema: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry: dict[str, Any] = {"class_name": "recipe.agent.search_tool.SearchTool", "config": dict(TOOL_CONFIG)}
    if with_schema:
        schema = search_tool.DEFAULT_TOOL_SCHEMA.model_dump(exclude_unset=True, exclude_none=True)
        schema["function"]["description"] = "Wikipedia search."
        entry["tool_schema"] = schema
    path = tmp_path / "tools.yaml"
    path.write_text(OmegaConf.to_yaml({"tools": [entry]}))
    searcher = FakeSearcher()
    made: list[tuple[str, float]] = []

    def factory(url: str, timeout_s: float) -> FakeSearcher:
        made.append((url, timeout_s))
        return searcher

    monkeypatch.setattr(search_tool, "retrieval_client", factory)
    (tool,) = initialize_tools_from_config(str(path))
    assert isinstance(tool, search_tool.SearchTool) and tool.name == "search"
    assert tool.tool_schema.function.description == (
        "Wikipedia search." if with_schema else search_tool.DEFAULT_TOOL_SCHEMA.function.description
    )
    assert (tool.topk, tool.max_result_chars, tool.timeout_s) == (3, 3000, 30.0)
    response, _, _ = execute(tool, {"query": "paris"})
    assert made == [("http://127.0.0.1:8000/retrieve", 30.0)]
    assert response.text == format_passages(PASSAGES, 3000)


# --- rehearsal: the real tiny model through the hf rollout, against the real retrieval server ---------------------


@pytest.fixture(scope="module")
def retrieval_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``recipe.search.server`` on loopback over an index of the HotpotQA sample's own paragraphs."""
    from recipe.search.hotpot_corpus import write_corpus
    from recipe.search.index import build_index

    work = tmp_path_factory.mktemp("retrieval")
    write_corpus(str(HOTPOT), work / "corpus.jsonl")
    build_index(work / "corpus.jsonl", work / "index")
    with RetrievalServer(work / "index") as server:
        yield server.url


@pytest.mark.slow
def test_the_tiny_model_searches_the_real_retriever_through_the_hf_rollout(
    tokenizer: Any, retrieval_url: str, tmp_path: Path
) -> None:
    """The GPU smoke run's rollout on CPU (gpu/device.sh search): 8 HotpotQA questions x 6 samples of the tiny search
    model, warm-started as the smoke run's is, generated by the hf rollout's server (batched, stop strings, budgets
    of their own) and searched through the real ``/retrieve`` with the smoke run's settings. Every transcript must
    be one consistent token sequence whose unmasked parts are exactly the result blocks, and the environment's
    answers must carry passages of the index."""
    import torch

    from gpu.verl_plugin import HFServer

    root = tiny.build_search(tmp_path / "tiny-search").root
    tiny.warm_start(root / "model", HOTPOT, steps=600)
    engine = HFServer(str(root / "model"), "float32", 768, 0, None)

    class Engine:  # verl's server client, reduced to the one call the agent loop makes
        async def generate(
            self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any
        ) -> TokenOutput:
            return await engine.generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)

    questions = [record["question"] for record in json.loads(HOTPOT.read_text(encoding="utf-8"))[:8]] * 6

    async def rollout() -> list[Any]:
        config = trainer_config(response_length=768)
        loops = [
            verl_loop.SearchAgentLoop(
                **verl_kwargs(Engine(), tokenizer, config), retrieval_url=retrieval_url, topk=1, max_result_chars=400
            )
            for _ in questions
        ]
        return await asyncio.gather(
            *(loop.run(dict(SAMPLING), raw_prompt=build_messages(q)) for loop, q in zip(loops, questions, strict=True))
        )

    torch.manual_seed(0)
    outputs = asyncio.run(rollout())
    requests, batches = engine.served()
    assert batches < requests / 4  # turns of different trajectories share generate calls
    with_passages = 0
    for output in outputs:
        ids, mask = output.response_ids, output.response_mask
        assert len(ids) == len(mask) == len(output.response_logprobs) <= 768
        for start, end in model_spans([1 - bit for bit in mask]):  # what the model did not write
            block = decode(tokenizer, ids[start:end])
            assert block.startswith("\n\n<result>\n") and block.endswith("</result>\n\n") and len(block) <= 400
        assert all(lp == 0.0 for lp, bit in zip(output.response_logprobs, mask, strict=True) if not bit)
        text = decode(tokenizer, ids, skip=True)
        with_passages += text.count("</search>\n\n<result>\nDoc 1 (Title: ")
        assert set(reward.compute_score("hotpotqa", text, {"target": ["x"]})) >= {"score", "n_calls"}
        assert output.extra_fields["num_failed_searches"] == 0
    assert with_passages >= 5
