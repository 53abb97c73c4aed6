"""What ``recipe.eval_hotpotqa`` and ``recipe.eval_gaia`` share: the command-line flags, running the episodes
(``recipe.agent.episode.run_episode`` over a :class:`~recipe.agent.openai_chat.ChatTranscript`, ``--concurrency``
episodes at a time on one event loop), the per-question record, the episode statistics, the output files and the
error handling.

Output (``--out DIR``): ``predictions.jsonl`` (one record per question, in input order: the transcript, the
answer, the benchmark's scores, turns, searches, ending) and ``summary.json`` (the figures, the flags, the
counts). Both are written when the run is complete, each atomically (a temporary file in DIR, then
``os.replace``), so a folder holds a whole run or none. An existing output is never overwritten without
``--force``; that is checked before the first request. A run that fails on the model endpoint stops (the scores
of an unreachable model would be zeros, not results) and writes nothing. There is no resume.

Before the first episode the runner checks the endpoint (``GET /models``: reachable, serves ``--model``), then
the retriever (one search for the first question), so a dead service is a one-line error, not a run of empty
results. A retrieval failure during the run is what the agent loop makes of it: an empty ``<result>``, counted
in ``failed_searches``.

Exit status: 0 done; 2 bad input (flags, data file, existing output); 1 a service failed (endpoint, retriever,
writing the output).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from recipe import atomic
from recipe.agent.episode import Ending, Episode, EpisodeLimits, Searcher, run_episode
from recipe.agent.openai_chat import (
    DEFAULT_CHARS_PER_TOKEN,
    DEFAULT_MAX_RESPONSE_TOKENS,
    ChatEndpoint,
    ChatTranscript,
    EndpointError,
)
from recipe.arguments import NON_NEGATIVE, POSITIVE, integer_at_least
from recipe.prepare_data import DataError
from recipe.scoring import extract_answer
from recipe.search.client import DEFAULT_RETRIEVAL_URL, RetrievalClient
from recipe.search.passage import RetrievalError

PREDICTIONS_FILE: Final = "predictions.jsonl"
SUMMARY_FILE: Final = "summary.json"
DEFAULT_ENDPOINT: Final = "http://127.0.0.1:8001/v1"
MIN_RESULT_CHARS: Final = 64
EXIT_INPUT: Final = 2
EXIT_SERVICE: Final = 1
PROGRESS_STEPS: Final = 10


class EvalError(Exception):
    """Input the evaluation cannot use (an existing output folder, no questions, a flag out of range); the CLI
    prints it on one line and exits 2."""


class ServiceError(Exception):
    """A service the evaluation needs is missing or refuses (a model not served, no retrieval client); exit 1."""


@dataclass(frozen=True, slots=True)
class Question:
    """One question to evaluate: its id, text, gold answers (aliases; GAIA has one), and benchmark fields kept in
    the record (GAIA's level and file_name)."""

    id: str
    text: str
    gold: tuple[str, ...]
    attributes: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EpisodeResult:
    """One question's episode: the loop's account, the assistant's whole response, the answer read from it as
    the reward reads it, and the cost."""

    question: Question
    episode: Episode
    response: str
    answer: str | None
    response_tokens: int
    requests: int
    seconds: float


@dataclass(frozen=True, slots=True)
class RunSettings:
    limits: EpisodeLimits
    concurrency: int
    max_response_tokens: int
    chars_per_token: float = DEFAULT_CHARS_PER_TOKEN


class Benchmark(Protocol):
    """What differs between the benchmarks: reading the questions, scoring one answer, the summary figures."""

    name: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def load(self, args: argparse.Namespace) -> list[Question]: ...

    def score(self, question: Question, answer: str | None) -> dict[str, Any]: ...

    def summarize(self, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]: ...

    def describe(self, summary: Mapping[str, Any]) -> str: ...


# ---------------------------------------------------------------- pure pieces


def one_line(text: str) -> str:
    return " ".join(text.split())


def record_of(result: EpisodeResult, scores: Mapping[str, Any]) -> dict[str, Any]:
    """The predictions.jsonl record of one episode."""
    question, episode = result.question, result.episode
    return {
        "id": question.id,
        "question": question.text,
        "gold": list(question.gold),
        "prediction": result.answer,
        **scores,
        "ending": episode.ending.value,
        "turns": episode.turns,
        "searches": episode.searches,
        "queries": list(episode.queries),
        "failed_searches": episode.failed_searches,
        "invalid_turns": episode.invalid_turns,
        "response_tokens": result.response_tokens,
        "requests": result.requests,
        "search_seconds": round(episode.search_seconds, 3),
        "seconds": round(result.seconds, 3),
        "errors": list(episode.errors),
        **question.attributes,
        "transcript": result.response,
    }


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def episode_stats(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Figures every benchmark reports: searches per question, endings (all four, zeros included), failed
    searches, invalid turns, unanswered questions."""
    endings = Counter(str(record["ending"]) for record in records)
    return {
        "searches_per_question": mean([float(record["searches"]) for record in records]),
        "turns_per_question": mean([float(record["turns"]) for record in records]),
        "endings": {ending.value: endings.get(ending.value, 0) for ending in Ending},
        "no_answer": sum(1 for record in records if record["prediction"] is None),
        "failed_searches": sum(int(record["failed_searches"]) for record in records),
        "invalid_turns": sum(int(record["invalid_turns"]) for record in records),
    }


def describe_stats(stats: Mapping[str, Any]) -> str:
    endings = " / ".join(f"{name} {count}" for name, count in stats["endings"].items())
    return f"{stats['searches_per_question']:.1f} searches/question, endings {endings}"


def progress_marks(total: int) -> set[int]:
    """The completed counts at which progress is reported: about every tenth of ``total``."""
    return {max(1, total * step // PROGRESS_STEPS) for step in range(1, PROGRESS_STEPS + 1)}


# ---------------------------------------------------------------- running


async def run_one(
    question: Question, endpoint: ChatEndpoint, searcher: Searcher, settings: RunSettings
) -> EpisodeResult:
    started = time.monotonic()
    transcript = ChatTranscript(
        endpoint,
        question.text,
        max_response_tokens=settings.max_response_tokens,
        chars_per_token=settings.chars_per_token,
    )
    episode = await run_episode(transcript, searcher, settings.limits)
    response = transcript.full_text
    return EpisodeResult(
        question=question,
        episode=episode,
        response=response,
        answer=extract_answer(response),
        response_tokens=transcript.tokens_used,
        requests=transcript.requests,
        seconds=time.monotonic() - started,
    )


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


async def run_all(
    questions: Sequence[Question],
    endpoint: ChatEndpoint,
    searcher: Searcher,
    settings: RunSettings,
    on_done: Callable[[int], None] = lambda done: None,
) -> list[EpisodeResult]:
    """Every question's episode, at most ``settings.concurrency`` at once, results in input order. The first
    endpoint failure cancels the rest and is raised as itself."""
    gate = asyncio.Semaphore(settings.concurrency)
    results: list[EpisodeResult | None] = [None] * len(questions)
    done = 0

    async def worker(index: int, question: Question) -> None:
        nonlocal done
        async with gate:
            results[index] = await run_one(question, endpoint, searcher, settings)
        done += 1
        on_done(done)

    try:
        async with asyncio.TaskGroup() as group:
            for index, question in enumerate(questions):
                group.create_task(worker(index, question))
    except BaseExceptionGroup as failures:
        raise _first_leaf(failures) from None
    return [result for result in results if result is not None]


async def check_endpoint(endpoint: ChatEndpoint) -> None:
    """The endpoint answers ``GET /models`` and serves ``endpoint.model`` (skipped where there is no such route)."""
    served = await endpoint.served_models()
    if served is not None and endpoint.model not in served:
        listed = ", ".join(served) or "none"
        raise ServiceError(
            f"{endpoint.base_url} does not serve model {endpoint.model!r} (it serves: {listed}); "
            "pass one of them as --model"
        )


async def check_searcher(searcher: Searcher, probe: str) -> None:
    """The retriever answers one query (a RetrievalError otherwise)."""
    await searcher.search([probe], 1)


# ---------------------------------------------------------------- files


def output_paths(out: Path) -> tuple[Path, Path]:
    return out / PREDICTIONS_FILE, out / SUMMARY_FILE


def check_output(out: Path, force: bool) -> None:
    """Refuse an output folder that already holds a run (unless ``force``) or is a file."""
    if out.exists() and not out.is_dir():
        raise EvalError(f"--out {out} is a file; pass a folder")
    existing = [path for path in output_paths(out) if path.exists()]
    if existing and not force:
        raise EvalError(f"{existing[0]} already exists; pass --force to overwrite it, or another --out folder")


def json_text(value: object, **options: Any) -> str:
    """``json.dumps`` with non-ASCII kept readable, unless the value holds a lone surrogate (a model's reply can:
    JSON's ``"\\ud800"`` decodes to one), which UTF-8 cannot store: then every non-ASCII character is escaped."""
    text = json.dumps(value, ensure_ascii=False, **options)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, ensure_ascii=True, **options)
    return text


def write_outputs(out: Path, records: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]) -> None:
    """Both files written before either replaces its old one, then replaced as a pair (``atomic.replacing_pair``:
    the old summary is put back if the predictions cannot be replaced)."""
    predictions, summary_path = output_paths(out)
    with atomic.replacing_pair(summary_path, predictions) as (summary_tmp, predictions_tmp):
        lines = "".join(json_text(record) + "\n" for record in records)
        predictions_tmp.write_text(lines, encoding="utf-8")
        summary_tmp.write_text(json_text(summary, indent=2) + "\n", encoding="utf-8")


# ---------------------------------------------------------------- command line


def build_parser(benchmark: Benchmark, description: str, data_help: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m recipe.{benchmark.name}", description=description)
    parser.add_argument("--data", metavar="PATH", required=True, help=data_help)
    parser.add_argument("--out", metavar="DIR", required=True, help=f"folder for {PREDICTIONS_FILE} and {SUMMARY_FILE}")
    parser.add_argument("--force", action="store_true", help="overwrite an existing run in --out")
    parser.add_argument(
        "--endpoint",
        default=DEFAULT_ENDPOINT,
        metavar="URL",
        help=f"OpenAI-compatible base URL, as `vllm serve` serves it (default {DEFAULT_ENDPOINT})",
    )
    parser.add_argument("--model", required=True, help="model name the endpoint serves (vllm serve's model path)")
    parser.add_argument(
        "--retrieval-url",
        default=DEFAULT_RETRIEVAL_URL,
        metavar="URL",
        help=f"the retrieval server's /retrieve URL (default {DEFAULT_RETRIEVAL_URL})",
    )
    parser.add_argument("--limit", type=POSITIVE, metavar="N", help="evaluate the first N questions only")
    parser.add_argument("--concurrency", type=POSITIVE, default=8, metavar="K", help="episodes at once (default 8)")
    limits = EpisodeLimits()
    parser.add_argument(
        "--max-turns",
        type=POSITIVE,
        default=limits.max_turns,
        metavar="N",
        help=f"model generations per episode; the last cannot search (default {limits.max_turns})",
    )
    parser.add_argument(
        "--topk", type=POSITIVE, default=limits.topk, metavar="K", help=f"passages per search (default {limits.topk})"
    )
    parser.add_argument(
        "--max-result-chars",
        type=integer_at_least(MIN_RESULT_CHARS),
        default=limits.max_result_chars,
        metavar="N",
        help=f"characters per <result> block (default {limits.max_result_chars})",
    )
    parser.add_argument(
        "--max-response-tokens",
        type=POSITIVE,
        default=DEFAULT_MAX_RESPONSE_TOKENS,
        metavar="N",
        help="response budget per episode in tokens, model text and results together; match training's "
        f"data.max_response_length (default {DEFAULT_MAX_RESPONSE_TOKENS})",
    )
    parser.add_argument(
        "--temperature", type=float, default=0.0, metavar="T", help="sampling temperature (default 0: greedy)"
    )
    parser.add_argument(
        "--retries",
        type=NON_NEGATIVE,
        default=3,
        metavar="N",
        help="retries of an endpoint request after a connection error or 5xx (default 3)",
    )
    benchmark.add_arguments(parser)
    return parser


def _default_searcher(url: str) -> Searcher:
    return RetrievalClient(url)


async def _close(resource: object) -> None:
    closer = getattr(resource, "aclose", None)
    if closer is not None:
        result = closer()
        if inspect.isawaitable(result):
            await result


async def evaluate(
    benchmark: Benchmark, args: argparse.Namespace, questions: Sequence[Question], searcher: Searcher | None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run every question and score it: (records, summary)."""
    endpoint = ChatEndpoint(args.endpoint, args.model, temperature=args.temperature, retries=args.retries)
    settings = RunSettings(
        limits=EpisodeLimits(max_turns=args.max_turns, topk=args.topk, max_result_chars=args.max_result_chars),
        concurrency=args.concurrency,
        max_response_tokens=args.max_response_tokens,
    )
    marks = progress_marks(len(questions))

    def report(done: int) -> None:
        if done in marks:
            print(f"{benchmark.name}: {done}/{len(questions)} done", file=sys.stderr, flush=True)

    started = time.monotonic()
    active: Searcher | None = searcher
    try:
        await check_endpoint(endpoint)
        if active is None:
            active = _default_searcher(args.retrieval_url)
        await check_searcher(active, questions[0].text)
        results = await run_all(questions, endpoint, active, settings, report)
    finally:
        await endpoint.aclose()
        if searcher is None and active is not None:
            await _close(active)
    records = [record_of(result, benchmark.score(result.question, result.answer)) for result in results]
    summary = {
        "benchmark": benchmark.name,
        **benchmark.summarize(records),
        **episode_stats(records),
        "data": str(args.data),
        "model": args.model,
        "endpoint": args.endpoint,
        "retrieval_url": args.retrieval_url,
        "settings": {
            "limit": args.limit,
            "concurrency": args.concurrency,
            "max_turns": args.max_turns,
            "topk": args.topk,
            "max_result_chars": args.max_result_chars,
            "max_response_tokens": args.max_response_tokens,
            "temperature": args.temperature,
        },
        "seconds": round(time.monotonic() - started, 3),
    }
    return records, summary


def run_cli(
    benchmark: Benchmark, parser: argparse.ArgumentParser, argv: Sequence[str] | None, searcher: Searcher | None
) -> int:
    """Parse, check, load, run, write, print; errors become one line on stderr and a non-zero exit."""
    args = parser.parse_args(argv)
    prefix = f"{benchmark.name}: error:"
    out = Path(args.out)
    try:
        check_output(out, args.force)
        questions = benchmark.load(args)
        if args.limit is not None:
            questions = questions[: args.limit]
        if not questions:
            raise EvalError(f"--data {args.data}: no questions to evaluate")
    except (DataError, EvalError) as error:
        print(f"{prefix} {one_line(str(error))}", file=sys.stderr)
        return EXIT_INPUT
    except OSError as error:  # the data file exists but cannot be read
        print(f"{prefix} reading --data {args.data}: {one_line(str(error))}", file=sys.stderr)
        return EXIT_INPUT
    try:
        records, summary = asyncio.run(evaluate(benchmark, args, questions, searcher))
    except (EndpointError, RetrievalError, ServiceError) as error:
        print(f"{prefix} {one_line(str(error))}", file=sys.stderr)
        return EXIT_SERVICE
    try:
        write_outputs(out, records, summary)
    except OSError as error:
        print(f"{prefix} writing {out}: {one_line(str(error))}", file=sys.stderr)
        return EXIT_SERVICE
    print(benchmark.describe(summary))
    if summary["failed_searches"]:
        print(f"{benchmark.name}: warning: {summary['failed_searches']} searches failed (shown as empty results)")
    print(f"wrote {out / PREDICTIONS_FILE} and {out / SUMMARY_FILE}")
    return 0
