"""GAIA accuracy of the search agent behind an OpenAI-compatible endpoint (``vllm serve``), with GAIA's official
``question_scorer``::

    python -m recipe.eval_gaia --data GAIA/2023/validation/metadata.jsonl --level 1 --model checkpoints/step_500 \\
        --endpoint http://127.0.0.1:8001/v1 --out eval/gaia-l1

``--data``: ``metadata.jsonl`` (the original layout) or ``metadata.parquet`` (the current one) of the gated
``gaia-benchmark/GAIA`` dataset, rows ``{task_id, Question, Level, Final answer, file_name, …}``. Rows of
``--level`` are evaluated; the summary reports the whole level and its text-only subset (rows whose
``file_name`` is empty), with counts. The agent has no access to attached files: rows with one are asked as
they are, and count in the whole-level figure as GAIA counts them.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from recipe.agent.episode import Searcher
from recipe.eval_run import Question, build_parser, describe_stats, run_cli
from recipe.prepare_data import HOTPOTQA, DataError, read_records
from recipe.scoring import gaia_verdict

NAME: Final = "eval_gaia"
LEVELS: Final = (1, 2, 3)
TASK_ID: Final = "task_id"
QUESTION: Final = "Question"
LEVEL: Final = "Level"
FINAL_ANSWER: Final = "Final answer"
FILE_NAME: Final = "file_name"


def require_file(path: str) -> None:
    target = Path(path)
    if not target.is_file():
        what = "is a folder, not a file" if target.is_dir() else "does not exist"
        raise DataError(
            f"--data {path} {what}; pass GAIA's metadata.jsonl or metadata.parquet "
            "(e.g. GAIA/2023/validation/metadata.jsonl)"
        )


def _level(value: object, where: str) -> int:
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) not in LEVELS:
        raise DataError(f"{where}: '{LEVEL}' must be 1, 2 or 3, got {value!r}")
    return int(text)


def row_to_question(row: Mapping[str, Any], where: str) -> tuple[int, Question]:
    """(level, question) of one GAIA row; a DataError naming ``where`` and the field when it is malformed."""
    for key in (TASK_ID, QUESTION, FINAL_ANSWER):
        value = row.get(key)
        if value is None or (isinstance(value, str) and not value.strip()):
            raise DataError(f"{where}: no '{key}' (GAIA rows have {TASK_ID}, {QUESTION}, {LEVEL}, {FINAL_ANSWER})")
    if not isinstance(row[QUESTION], str):
        raise DataError(f"{where}: '{QUESTION}' must be a string, got {type(row[QUESTION]).__name__}")
    level = _level(row.get(LEVEL), where)
    file_name = row.get(FILE_NAME) or ""
    if not isinstance(file_name, str):
        raise DataError(f"{where}: '{FILE_NAME}' must be a string, got {type(file_name).__name__}")
    question = Question(
        id=str(row[TASK_ID]),
        text=row[QUESTION].strip(),
        gold=(str(row[FINAL_ANSWER]),),
        attributes={"level": level, "file_name": file_name},
    )
    return level, question


def load_level(path: str, level: int) -> tuple[list[Question], int]:
    """The questions of ``level`` in file order, and the number of rows read."""
    require_file(path)
    # read_records only uses its source argument for a missing file, which require_file has ruled out
    rows = [row_to_question(record, where) for where, record in read_records(path, "--data", HOTPOTQA)]
    return [question for row_level, question in rows if row_level == level], len(rows)


def _share(correct: int, total: int) -> dict[str, Any]:
    return {"questions": total, "correct": correct, "accuracy": correct / total if total else 0.0}


class Gaia:
    name = NAME

    def __init__(self) -> None:
        self.rows_read = 0
        self.level = LEVELS[0]

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--level", type=int, choices=LEVELS, default=1, help="GAIA level to evaluate (default 1)")

    def load(self, args: argparse.Namespace) -> list[Question]:
        self.level = args.level
        questions, self.rows_read = load_level(args.data, args.level)
        return questions

    def score(self, question: Question, answer: str | None) -> dict[str, Any]:
        verdict = gaia_verdict(answer, question.gold[0])
        return {
            "correct": verdict.correct,
            "answer_kind": verdict.kind.value,
            "list_length_mismatch": verdict.length_mismatch,
        }

    def summarize(self, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        text_only = [record for record in records if not record["file_name"]]
        return {
            "level": self.level,
            "rows_read": self.rows_read,
            **_share(sum(1 for record in records if record["correct"]), len(records)),
            "text_only": _share(sum(1 for record in text_only if record["correct"]), len(text_only)),
            "with_file": len(records) - len(text_only),
            "list_length_mismatches": sum(1 for record in records if record["list_length_mismatch"]),
        }

    def describe(self, summary: Mapping[str, Any]) -> str:
        text = summary["text_only"]
        return (
            f"{NAME}: level {summary['level']}, {summary['questions']} questions, accuracy "
            f"{summary['accuracy']:.3f} ({summary['correct']}/{summary['questions']}); text-only "
            f"{text['questions']} questions, accuracy {text['accuracy']:.3f} ({text['correct']}/{text['questions']}); "
            f"{describe_stats(summary)}; list length mismatches {summary['list_length_mismatches']}"
        )


def main(argv: Sequence[str] | None = None, *, searcher: Searcher | None = None) -> int:
    """The command line; ``searcher`` replaces the retrieval client (tests use an in-process one)."""
    benchmark = Gaia()
    parser = build_parser(
        benchmark,
        description="GAIA accuracy (official question_scorer) of the search agent behind an OpenAI-compatible "
        "endpoint, with the retrieval server as its search tool; the whole level and its text-only subset.",
        data_help="GAIA metadata.jsonl or metadata.parquet (fields task_id, Question, Level, Final answer, file_name)",
    )
    return run_cli(benchmark, parser, argv, searcher)


if __name__ == "__main__":
    raise SystemExit(main())
