"""The search as a native tool, for verl 0.9.1's built-in ``tool_agent`` loop (``multi_turn.format: hermes``): the
alternative to this recipe's ``search_agent`` loop, with the model calling a ``search`` function instead of writing
``<search>`` tags. Loaded by ``verl.tools.tool_registry.initialize_tools_from_config`` from a tool config such as::

    tools:
      - class_name: recipe.agent.search_tool.SearchTool
        config: {type: native, retrieval_service_url: "http://127.0.0.1:8000/retrieve", topk: 3, timeout: 30,
                 max_result_chars: 3000}
        # tool_schema: optional; the default is DEFAULT_TOOL_SCHEMA below

The tool agent creates, executes and releases an instance per call (``tool_agent_loop.py:443-496``), drops the
metrics dict, appends the reward (always 0.0 here: the outcome reward scores the answer) to ``tool_rewards``, and cuts
the text to ``multi_turn.max_tool_response_length`` characters (default 256: raise it to at least
``max_result_chars``, or the passages are cut in the middle).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from recipe.agent.episode import Searcher
from recipe.agent.protocol import format_passages
from recipe.agent.verl_loop import DEFAULT_RETRIEVAL_TIMEOUT_S, SearcherFactory, retrieval_client, shared_searcher
from recipe.search.passage import RetrievalError

logger = logging.getLogger(__name__)

TOOL_NAME = "search"
QUERY = "query"
DEFAULT_TOPK = 3
DEFAULT_MAX_RESULT_CHARS = 3000

NO_QUERY_TEXT = f"No search was made: call {TOOL_NAME} with a non-empty string argument '{QUERY}'."
FAILED_TEXT = "The search failed: the retriever did not answer. Search again, or answer with what you know."
NO_RESULTS_TEXT = "No passages were found for this query."

DEFAULT_TOOL_SCHEMA = OpenAIFunctionToolSchema.model_validate(
    {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": "Searches a Wikipedia corpus and returns the top passages for one query.",
            "parameters": {
                "type": "object",
                "properties": {QUERY: {"type": "string", "description": "One fully-formed search query."}},
                "required": [QUERY],
            },
        },
    }
)


class ToolConfigError(ValueError):
    """A SearchTool config the tool cannot run with; the message names the key and the tool config."""


def _positive_int(config: Mapping[str, Any], key: str, default: int) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ToolConfigError(f"SearchTool config {key}={value!r}: must be a positive integer")
    return value


class SearchTool(BaseTool):
    """``search(query)`` → the top passages in Search-R1's ``Doc i (Title: t) text`` layout, at most
    ``max_result_chars`` characters. Never raises on a bad query or a failed retrieval: the model reads why."""

    def __init__(
        self,
        config: dict[str, Any],
        tool_schema: OpenAIFunctionToolSchema | None = None,
        *,
        searcher: Searcher | None = None,
        searcher_factory: SearcherFactory | None = None,
    ) -> None:
        """``config`` as the tool YAML gives it: ``type`` (native), ``retrieval_service_url`` (required unless a
        ``searcher`` is given), ``topk`` (3), ``timeout`` seconds (30), ``max_result_chars`` (3000)."""
        super().__init__(config, tool_schema)  # type: ignore[arg-type]  # BaseTool falls back to the default
        self.topk = _positive_int(config, "topk", DEFAULT_TOPK)
        self.max_result_chars = _positive_int(config, "max_result_chars", DEFAULT_MAX_RESULT_CHARS)
        self.timeout_s = float(config.get("timeout", DEFAULT_RETRIEVAL_TIMEOUT_S))
        self.url = config.get("retrieval_service_url")
        if searcher is None and not (isinstance(self.url, str) and self.url):
            raise ToolConfigError(f"SearchTool config needs retrieval_service_url (the /retrieve URL), got {config}")
        self._searcher = searcher
        self._searcher_factory = searcher_factory or retrieval_client

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return DEFAULT_TOOL_SCHEMA

    def searcher(self) -> Searcher:
        if self._searcher is None:
            assert isinstance(self.url, str)
            self._searcher = shared_searcher(self.url, self.timeout_s, self._searcher_factory)
        return self._searcher

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        query = parameters.get(QUERY)
        if not isinstance(query, str) or not query.strip():
            return ToolResponse(text=NO_QUERY_TEXT), 0.0, {"searched": 0, "failed": 0}
        query = " ".join(query.split())
        try:
            passages = (await self.searcher().search([query], self.topk))[0]
        except RetrievalError as error:
            logger.warning("SearchTool %s: query %r failed: %s", instance_id, query, error)
            return ToolResponse(text=FAILED_TEXT), 0.0, {"searched": 1, "failed": 1}
        text = format_passages(passages, self.max_result_chars) or NO_RESULTS_TEXT
        return ToolResponse(text=text), 0.0, {"searched": 1, "failed": 0, "passages": len(passages)}
