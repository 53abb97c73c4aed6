"""The search agent's instructions: the one place the protocol's tags and wording live.

The model reasons in ``<think>…</think>``, asks the retriever with ``<search>query</search>``, is shown the
retrieved passages in ``<result>…</result>`` (written by the tool, never by the model) and ends with
``<answer>…</answer>``. The data preparation writes these messages into every row's ``prompt``; the tool and the
reward read the same tag constants from here, so the three cannot drift apart.
"""

from __future__ import annotations

from typing import Final

THINK_OPEN: Final = "<think>"
THINK_CLOSE: Final = "</think>"
SEARCH_OPEN: Final = "<search>"
SEARCH_CLOSE: Final = "</search>"
RESULT_OPEN: Final = "<result>"
RESULT_CLOSE: Final = "</result>"
ANSWER_OPEN: Final = "<answer>"
ANSWER_CLOSE: Final = "</answer>"

SYSTEM_PROMPT: Final = (
    "You are a research assistant that answers questions by searching a Wikipedia corpus.\n"
    f"Every time you receive new information, first reason about it inside {THINK_OPEN} and {THINK_CLOSE}.\n"
    "If you find you lack some knowledge, call the search engine by writing a query inside "
    f"{SEARCH_OPEN} and {SEARCH_CLOSE}, for example {SEARCH_OPEN}capital of France{SEARCH_CLOSE}; "
    f"the top passages will be returned to you between {RESULT_OPEN} and {RESULT_CLOSE}. "
    "You may search as many times as you need; search one fact at a time.\n"
    "When you have enough information, give the final answer inside "
    f"{ANSWER_OPEN} and {ANSWER_CLOSE} without any explanation, for example "
    f"{ANSWER_OPEN}Beijing{ANSWER_CLOSE}. Keep the answer short: a name, a date, a number, yes or no."
)

# For verl's built-in ``tool_agent`` loop (``multi_turn.format: hermes``): the search is a native function call that
# the chat template describes (the tool schema of recipe/agent/search_tool.py) and the results come back as tool
# messages, so the <search>/<result> instructions above do not apply; reasoning and the answer keep their tags, which
# the reward reads.
NATIVE_SYSTEM_PROMPT: Final = (
    "You are a research assistant that answers questions by searching a Wikipedia corpus.\n"
    f"Every time you receive new information, first reason about it inside {THINK_OPEN} and {THINK_CLOSE}.\n"
    "If you find you lack some knowledge, call the search function with one query; it returns the top passages. "
    "You may search as many times as you need; search one fact at a time.\n"
    "When you have enough information, give the final answer inside "
    f"{ANSWER_OPEN} and {ANSWER_CLOSE} without any explanation, for example "
    f"{ANSWER_OPEN}Beijing{ANSWER_CLOSE}. Keep the answer short: a name, a date, a number, yes or no."
)

USER_TEMPLATE: Final = "Question: {question}"


def user_message(question: str) -> str:
    """The user turn for ``question`` (surrounding whitespace removed)."""
    return USER_TEMPLATE.format(question=question.strip())


def build_messages(question: str, system_prompt: str = SYSTEM_PROMPT) -> list[dict[str, str]]:
    """The chat messages of one prompt: the system instructions (the tag protocol's by default), then the question."""
    return [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": user_message(question)},
    ]
