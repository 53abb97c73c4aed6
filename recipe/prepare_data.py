"""HotpotQA (distractor) + 2WikiMultihopQA → verl's train.parquet and val.parquet for the search agent.

    python -m recipe.prepare_data --hotpotqa hotpot_train_v1.1.json --2wiki 2wiki_train.json --out data/search

Each input is a local ``.json`` (a list of records), ``.jsonl`` or ``.parquet`` file in the official schema
(``_id``/``id``, ``question``, ``answer``, ...), or ``hf:NAME[:CONFIG][@SPLIT]`` to read a dataset already in the
Hugging Face cache (offline; needs the ``datasets`` package), e.g. ``hf:hotpotqa/hotpot_qa:distractor@train``.

The questions of both sources are pooled, duplicates dropped (questions equal after case folding and removing
punctuation; the first seen is kept, HotpotQA before 2Wiki), shuffled with ``--seed`` and split into val (first)
and train without overlap. With fewer records than ``--train-size + --val-size`` the split keeps their ratio and
the output says so. An input with no records is refused (exit 2) and nothing is written.

The pair is replaced as a pair (``atomic.replacing_pair``): both files are written to temporary files in the output
folder first (any bad input or write error leaves the old pair untouched), then val.parquet and train.parquet are
renamed over the old ones, and if the second rename fails the old val.parquet is put back. What does not hold: a
reader in the instant between the two renames, or a crash (SIGKILL, power loss) in it, sees the new val beside the
old train; running the same command again repairs it.

Every bad input is one line ``error: FILE line N: what`` (``record N`` in a .json list, ``row N`` in parquet) and
exit 2, never a traceback: malformed or too deeply nested JSON, an integer of more than 4300 digits, a lone
surrogate in a question, answer or id, a NaN or infinite answer, an id that is not a string or an integer.

The pure steps (records → items → rows, dedup, split) are separate from the file IO below them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import sys
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq

from recipe import atomic
from recipe.arguments import NON_NEGATIVE
from recipe.prompt import NATIVE_SYSTEM_PROMPT, SYSTEM_PROMPT, build_messages

HOTPOTQA: Final = "hotpotqa"
TWOWIKI: Final = "2wikimultihopqa"
SOURCES: Final = (HOTPOTQA, TWOWIKI)
ABILITY: Final = "multihop_qa"
DEFAULT_AGENT: Final = "search_agent"
# verl's built-in multi-turn loop: native (hermes) function calls to recipe/agent/search_tool.py, its own prompt
NATIVE_TOOL_AGENT: Final = "tool_agent"
TOOL_NAME: Final = "search"
SPLITS: Final = ("train", "val")
HF_PREFIX: Final = "hf:"
HF_DEFAULTS: Final = {HOTPOTQA: "hf:hotpotqa/hotpot_qa:distractor@train", TWOWIKI: "hf:<2wiki dataset>@train"}

# fields that may hold the gold answer or its aliases, in the order they are merged
ANSWER_FIELDS: Final = ("answer", "answers", "golden_answers", "answer_aliases")
ID_FIELDS: Final = ("_id", "id", "idx")

COLUMNS: Final = ("data_source", "prompt", "ability", "reward_model", "extra_info", "agent_name")

_TARGET = pa.struct([("target", pa.list_(pa.string()))])
SCHEMA: Final = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", _TARGET)])),
        (
            "extra_info",
            pa.struct(
                [
                    ("id", pa.string()),
                    ("index", pa.int64()),
                    ("split", pa.string()),
                    ("question", pa.string()),
                    ("need_tools_kwargs", pa.bool_()),
                    (
                        "tools_kwargs",
                        pa.struct(
                            [
                                (
                                    TOOL_NAME,
                                    pa.struct(
                                        [
                                            (
                                                "create_kwargs",
                                                pa.struct(
                                                    [
                                                        ("ground_truth", _TARGET),
                                                        ("question", pa.string()),
                                                        ("data_source", pa.string()),
                                                    ]
                                                ),
                                            )
                                        ]
                                    ),
                                )
                            ]
                        ),
                    ),
                ]
            ),
        ),
        ("agent_name", pa.string()),
    ]
)


class DataError(Exception):
    """Input the preparation cannot use (missing file, malformed line, a record without a question or answer);
    the message names the file and what to do. The CLI prints it and exits 2."""


@dataclass(frozen=True)
class QAItem:
    """One question with its gold answers (first = the dataset's answer, then aliases), from ``source``."""

    source: str
    id: str
    question: str
    answers: tuple[str, ...]


# ---------------------------------------------------------------- pure steps


def normalize_question(text: str) -> str:
    """The dedup key: NFKC, case folded, punctuation and symbols removed, whitespace collapsed."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    kept = "".join(ch if not unicodedata.category(ch).startswith(("P", "S")) else " " for ch in folded)
    return " ".join(kept.split())


def _text(where: str, field: str, text: str) -> str:
    """``text`` when it can be written as UTF-8; a DataError naming the field for a lone surrogate (JSON's
    ``"\\ud800"`` decodes to one, and parquet cannot store it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise DataError(
            f"{where}: '{field}' holds a lone surrogate (U+{ord(text[error.start]):04X}) at character "
            f"{error.start}, which is not valid Unicode text"
        ) from None
    return text


def _answers_of(record: Mapping[str, Any], where: str = "record") -> tuple[str, ...]:
    found: list[str] = []
    for field in ANSWER_FIELDS:
        value = record.get(field)
        values = list(value) if isinstance(value, list | tuple) else [value]
        for answer in values:
            # a number is an answer too ("answer": 1998 in some re-exports); bool is not (it is an int in Python)
            if isinstance(answer, float) and not math.isfinite(answer):
                # NaN, Infinity and 1e999 parse as floats and would become the gold answers "nan" and "inf"
                raise DataError(f"{where}: '{field}' is not a finite number ({answer}); an answer is text or a number")
            if isinstance(answer, str | int | float) and not isinstance(answer, bool):
                text = _text(where, field, str(answer).strip())
                if text and text not in found:
                    found.append(text)
    return tuple(found)


def _id_of(record: Mapping[str, Any], where: str) -> str:
    field = next((f for f in ID_FIELDS if record.get(f) is not None), None)
    if field is None:
        return ""
    ident = record[field]
    if isinstance(ident, float) and not math.isfinite(ident):
        raise DataError(f"{where}: '{field}' is not a finite number ({ident}); an id is a string or an integer")
    if isinstance(ident, list | tuple | dict):  # a nested value is no id (and str() of a deep one recurses)
        raise DataError(f"{where}: '{field}' must be a string or an integer, got {type(ident).__name__}")
    return _text(where, field, str(ident))


def record_to_item(record: Mapping[str, Any], source: str, where: str) -> QAItem:
    """A QA item from one dataset record; ``where`` (file and line/record) goes into the error of a bad one."""
    question = record.get("question")
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: no question (a non-empty string field 'question' is needed)")
    question = _text(where, "question", question.strip())
    answers = _answers_of(record, where)
    if not answers:
        raise DataError(f"{where}: no answer (one of the fields {', '.join(ANSWER_FIELDS)} is needed)")
    return QAItem(source=source, id=_id_of(record, where), question=question, answers=answers)


def dedup(items: Iterable[QAItem]) -> tuple[list[QAItem], list[QAItem]]:
    """(kept, dropped): the first item of each normalised question is kept, in input order."""
    seen: set[str] = set()
    kept: list[QAItem] = []
    dropped: list[QAItem] = []
    for item in items:
        key = normalize_question(item.question)
        (dropped if key in seen else kept).append(item)
        seen.add(key)
    return kept, dropped


def shuffled(items: Sequence[QAItem], seed: int) -> list[QAItem]:
    """A copy of ``items`` in a random order fixed by ``seed``."""
    out = list(items)
    random.Random(seed).shuffle(out)
    return out


def split_sizes(available: int, train_size: int, val_size: int) -> tuple[int, int]:
    """(train, val) counts. Enough records: the requested sizes. Too few: all of them, split in the requested
    ratio (val at least one when asked for and two or more records exist, so train is never left empty by val)."""
    if train_size < 0 or val_size < 0:
        raise ValueError("sizes must be non-negative")
    if available >= train_size + val_size:
        return train_size, val_size
    if train_size == 0 or val_size == 0:
        return min(train_size, available), min(val_size, available)
    val = round(available * val_size / (train_size + val_size))
    if available >= 2:
        val = min(max(val, 1), available - 1)
    return available - val, val


def split(items: Sequence[QAItem], train_size: int, val_size: int) -> tuple[list[QAItem], list[QAItem]]:
    """(train, val) from already shuffled ``items``: val is the first ``val`` items, train the next ones."""
    n_train, n_val = split_sizes(len(items), train_size, val_size)
    return list(items[n_val : n_val + n_train]), list(items[:n_val])


def system_prompt_for(agent_name: str) -> str:
    """The system prompt of ``agent_name``'s protocol: native function calls for verl's ``tool_agent``, the search
    tags for every other loop (this recipe's ``search_agent``)."""
    return NATIVE_SYSTEM_PROMPT if agent_name == NATIVE_TOOL_AGENT else SYSTEM_PROMPT


def item_to_row(item: QAItem, split_name: str, index: int, agent_name: str = DEFAULT_AGENT) -> dict[str, Any]:
    """One verl row (exactly ``COLUMNS``) for ``item``, the ``index``-th of split ``split_name``."""
    ground_truth = {"target": list(item.answers)}
    return {
        "data_source": item.source,
        "prompt": build_messages(item.question, system_prompt_for(agent_name)),
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {
            "id": item.id,
            "index": index,
            "split": split_name,
            "question": item.question,
            "need_tools_kwargs": True,
            "tools_kwargs": {
                TOOL_NAME: {
                    "create_kwargs": {
                        "ground_truth": {"target": list(item.answers)},
                        "question": item.question,
                        "data_source": item.source,
                    }
                }
            },
        },
        "agent_name": agent_name,
    }


def items_to_rows(items: Sequence[QAItem], split_name: str, agent_name: str = DEFAULT_AGENT) -> list[dict[str, Any]]:
    return [item_to_row(item, split_name, i, agent_name) for i, item in enumerate(items)]


# ---------------------------------------------------------------- file IO


def _parse_hf(spec: str) -> tuple[str, str | None, str]:
    rest = spec[len(HF_PREFIX) :]
    rest, _, split_name = rest.partition("@")
    name, _, config = rest.partition(":")
    return name, config or None, split_name or "train"


def _read_hf(spec: str, flag: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    name, config, split_name = _parse_hf(spec)
    if not name:
        raise DataError(f"{flag} {spec}: no dataset name (write hf:NAME[:CONFIG][@SPLIT])")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"{flag} {spec}: reading the Hugging Face cache needs the 'datasets' package (pip install datasets); "
            "or pass a local .json, .jsonl or .parquet file"
        ) from None
    try:
        dataset = datasets.load_dataset(name, config, split=split_name)
    except Exception as error:
        raise DataError(
            f"{flag} {spec}: not loadable from the Hugging Face cache (offline: HF_DATASETS_OFFLINE="
            f"{os.environ.get('HF_DATASETS_OFFLINE')}): {error}; download it first, or pass a local file"
        ) from None
    for i, record in enumerate(dataset):
        yield f"{spec} record {i}", record


# JSON's tokens as far as locating a failure needs them: strings (skipped whole), brackets, newlines, numbers
_JSON_TOKENS: Final = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}\n]|-?\d+(\.\d+)?([eE][-+]?\d+)?')
INT_DIGITS_LIMIT: Final = 4300  # Python's int/str conversion limit (sys.get_int_max_str_digits), json's too


def _json_failure(path: Path, text: str, first_line: int, error: ValueError | RecursionError) -> DataError:
    """The one-line error for JSON that ``json`` cannot decode although it is well formed: nesting past the
    recursion limit, or an integer past Python's digit limit; the line is found by scanning ``text``."""
    line, depth, deepest, deepest_line = first_line, 0, 0, first_line
    for match in _JSON_TOKENS.finditer(text):
        token = match.group()
        if token == "\n":
            line += 1
        elif token[0] == '"':
            line += token.count("\n")
        elif token in "[{":
            depth += 1
            if depth > deepest:
                deepest, deepest_line = depth, line
        elif token in "]}":
            depth -= 1
        elif (
            isinstance(error, ValueError)
            and match.group(1) is None
            and match.group(2) is None
            and len(token.lstrip("-")) > INT_DIGITS_LIMIT
        ):
            return DataError(
                f"{path} line {line}: an integer of more than {INT_DIGITS_LIMIT} digits ({len(token.lstrip('-'))}); "
                "write a long id as a string"
            )
    if isinstance(error, RecursionError):
        return DataError(f"{path} line {deepest_line}: JSON nested too deeply ({deepest} levels)")
    return DataError(f"{path} line {first_line}: not valid JSON ({error})")


def _read_local(path: Path) -> Iterator[tuple[str, Mapping[str, Any]]]:
    try:
        yield from _read_local_file(path)
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text (byte {error.start}: {error.reason})") from None
    except OSError as error:
        raise DataError(f"{path}: cannot be read ({error.strerror or error})") from None


def _read_local_file(path: Path) -> Iterator[tuple[str, Mapping[str, Any]]]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise DataError(f"{path} line {number}: not valid JSON ({error.msg})") from None
                except (ValueError, RecursionError) as error:
                    raise _json_failure(path, line, number, error) from None
                if not isinstance(record, dict):
                    raise DataError(f"{path} line {number}: a JSON object is needed, got {type(record).__name__}")
                yield f"{path} line {number}", record
    elif suffix == ".json":
        text = path.read_text(encoding="utf-8")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise DataError(f"{path} line {error.lineno}: not valid JSON ({error.msg})") from None
        except (ValueError, RecursionError) as error:
            raise _json_failure(path, text, 1, error) from None
        del text
        if not isinstance(data, list):
            raise DataError(f"{path}: a JSON list of records is needed, got {type(data).__name__}")
        for i, record in enumerate(data):
            if not isinstance(record, dict):
                raise DataError(f"{path} record {i}: a JSON object is needed, got {type(record).__name__}")
            yield f"{path} record {i}", record
    elif suffix == ".parquet":
        try:
            table = pq.read_table(path)
        except (pa.ArrowException, OSError) as error:
            raise DataError(f"{path}: not a readable parquet file ({error})") from None
        for i, record in enumerate(table.to_pylist()):
            yield f"{path} row {i}", record
    else:
        raise DataError(f"{path}: unknown file type '{suffix}' (pass a .json list, .jsonl or .parquet file)")


def read_records(spec: str, flag: str, source: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(where, record) pairs from a local file or ``hf:...``; a missing path is a DataError saying what to pass."""
    if spec.startswith(HF_PREFIX):
        yield from _read_hf(spec, flag)
        return
    path = Path(spec)
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "does not exist"
        raise DataError(
            f"{flag} {spec}: {what}; pass a local .json, .jsonl or .parquet file, "
            f"or {HF_DEFAULTS[source]} to read the Hugging Face cache"
        )
    yield from _read_local(path)


def load_items(spec: str, flag: str, source: str) -> list[QAItem]:
    return [record_to_item(record, source, where) for where, record in read_records(spec, flag, source)]


def write_parquet(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    """``rows`` as verl's parquet (the caller makes it atomic: ``atomic.replacing``)."""
    pq.write_table(pa.Table.from_pylist(list(rows), schema=SCHEMA), path)


# ---------------------------------------------------------------- command line


def _count(items: Iterable[QAItem]) -> Counter[str]:
    return Counter(item.source for item in items)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m recipe.prepare_data",
        description="HotpotQA + 2WikiMultihopQA -> verl train.parquet / val.parquet for the search agent.",
    )
    src = "a .json list, .jsonl or .parquet file, or hf:NAME[:CONFIG][@SPLIT] (Hugging Face cache, offline)"
    parser.add_argument("--hotpotqa", metavar="FILE", help=f"HotpotQA (distractor) records: {src}")
    parser.add_argument("--2wiki", dest="twowiki", metavar="FILE", help=f"2WikiMultihopQA records: {src}")
    parser.add_argument("--out", metavar="DIR", required=True, help="folder for train.parquet and val.parquet")
    parser.add_argument("--train-size", type=NON_NEGATIVE, default=100_000, help="train rows (default 100000)")
    parser.add_argument("--val-size", type=NON_NEGATIVE, default=1000, help="val rows (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    parser.add_argument(
        "--agent-name", default=DEFAULT_AGENT, help=f"registered verl agent loop name (default {DEFAULT_AGENT})"
    )
    return parser


def run(args: argparse.Namespace) -> None:
    inputs = [(HOTPOTQA, "--hotpotqa", args.hotpotqa), (TWOWIKI, "--2wiki", args.twowiki)]
    items: list[QAItem] = []
    out = Path(args.out)
    for source, flag, spec in inputs:
        if spec is not None:
            loaded = load_items(spec, flag, source)
            if not loaded:  # a blank file would otherwise replace a good pair with empty ones
                raise DataError(f"{flag} {spec}: no records (an empty or blank input); nothing written to {out}")
            items.extend(loaded)
    kept, dropped = dedup(items)
    train, val = split(shuffled(kept, args.seed), args.train_size, args.val_size)
    # both written before either replaces its file, then replaced as a pair (val first, put back if train cannot
    # be replaced): an error leaves the old pair, never a new file beside an old one (which could share questions)
    with atomic.replacing_pair(out / "val.parquet", out / "train.parquet") as (val_tmp, train_tmp):
        write_parquet(items_to_rows(train, "train", args.agent_name), train_tmp)
        write_parquet(items_to_rows(val, "val", args.agent_name), val_tmp)

    read, after, dups = _count(items), _count(kept), _count(dropped)
    in_train, in_val = _count(train), _count(val)
    for source, _flag, spec in inputs:
        if spec is None:
            continue
        print(
            f"{source}: read {read[source]}, duplicates dropped {dups[source]}, kept {after[source]} "
            f"-> train {in_train[source]}, val {in_val[source]} ({spec})"
        )
    print(f"total: read {len(items)}, kept {len(kept)} -> train {len(train)}, val {len(val)} (seed {args.seed})")
    if len(train) < args.train_size or len(val) < args.val_size:
        print(
            f"note: {len(kept)} unique questions < requested train {args.train_size} + val {args.val_size}; "
            f"wrote train {len(train)} and val {len(val)}"
        )
    print(f"wrote {out / 'train.parquet'} and {out / 'val.parquet'}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.hotpotqa is None and args.twowiki is None:
        parser.print_usage(sys.stderr)
        print("error: give at least one of --hotpotqa FILE and --2wiki FILE", file=sys.stderr)
        return 2
    try:
        _text("--agent-name", "--agent-name", args.agent_name)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        run(args)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"error: cannot write to {args.out}: {error.strerror or error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
