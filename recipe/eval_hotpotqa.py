"""HotpotQA answer EM/F1 of the search agent behind an OpenAI-compatible endpoint (``vllm serve``)::

    python -m recipe.eval_hotpotqa --data hotpot_dev_distractor_v1.json --model checkpoints/step_500 \\
        --endpoint http://127.0.0.1:8001/v1 --retrieval-url http://127.0.0.1:8000/retrieve --out eval/hotpot

``--data``: the official dev file (a JSON list of ``{_id, question, answer, …}``), or a ``.jsonl`` / ``.parquet``
of ``{question, answer}`` rows (``answers`` / ``golden_answers`` / ``answer_aliases`` add aliases, so 2Wiki-style
files work too); read by ``recipe.prepare_data``'s readers. Each question is one episode of the shared turn loop;
the answer is the last ``<answer>`` of the response, scored with ``hotpot_evaluate_v1.py``'s EM and F1 (best over
aliases). Only the answer metrics: the agent predicts no supporting facts.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from recipe.agent.episode import Searcher
from recipe.eval_run import Question, build_parser, describe_stats, mean, run_cli
from recipe.prepare_data import HOTPOTQA, DataError, read_records, record_to_item
from recipe.scoring import best_score

NAME: Final = "eval_hotpotqa"


def require_file(path: str) -> None:
    """A DataError unless ``path`` is a readable file (checked here to say what the evaluation wants)."""
    target = Path(path)
    if not target.is_file():
        what = "is a folder, not a file" if target.is_dir() else "does not exist"
        raise DataError(
            f"--data {path} {what}; pass the HotpotQA dev file (hotpot_dev_distractor_v1.json) "
            "or a .jsonl/.parquet of {question, answer} rows"
        )


def load_questions(path: str) -> list[Question]:
    require_file(path)
    questions = []
    for index, (where, record) in enumerate(read_records(path, "--data", HOTPOTQA)):
        item = record_to_item(record, HOTPOTQA, where)
        questions.append(Question(id=item.id or f"row-{index}", text=item.question, gold=item.answers))
    return questions


class HotpotQA:
    name = NAME

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        return None

    def load(self, args: argparse.Namespace) -> list[Question]:
        return load_questions(args.data)

    def score(self, question: Question, answer: str | None) -> dict[str, Any]:
        scored = best_score(answer, question.gold)
        return {"em": scored.em, "f1": scored.f1}

    def summarize(self, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return {
            "questions": len(records),
            "em": mean([float(record["em"]) for record in records]),
            "f1": mean([float(record["f1"]) for record in records]),
        }

    def describe(self, summary: Mapping[str, Any]) -> str:
        return (
            f"{NAME}: {summary['questions']} questions, EM {summary['em']:.3f}, F1 {summary['f1']:.3f}, "
            f"{describe_stats(summary)}"
        )


def main(argv: Sequence[str] | None = None, *, searcher: Searcher | None = None) -> int:
    """The command line; ``searcher`` replaces the retrieval client (tests use an in-process one)."""
    benchmark = HotpotQA()
    parser = build_parser(
        benchmark,
        description="HotpotQA answer EM/F1 (hotpot_evaluate_v1.py rules) of the search agent behind an "
        "OpenAI-compatible endpoint, with the retrieval server as its search tool.",
        data_help="HotpotQA dev .json (official schema), or .jsonl/.parquet rows with question and answer",
    )
    return run_cli(benchmark, parser, argv, searcher)


if __name__ == "__main__":
    raise SystemExit(main())
