"""HTTP retrieval server over a BM25 index: the ``/retrieve`` API of Search-R1 and verl's search tool.

    python -m recipe.search.server --index DIR [--host 127.0.0.1] [--port 8000] [--default-topk 3] [--max-topk 50]

``POST /retrieve`` ``{"queries": [...], "topk": 3, "return_scores": true}`` answers
``{"result": [[{"document": {"id", "contents"}, "score": s}, ...], ...]}``, one list per query, best first (with
``return_scores`` false, bare documents); ``topk`` is optional (``--default-topk``). ``GET /health`` gives the
passage count and the index's manifest. A bad request gets a 4xx ``{"detail": "..."}`` naming the field.

Requests are coalesced: a micro-batcher gathers the queries of requests that arrive while the engine is busy or
within ``--batch-wait-ms`` of the first, up to ``--max-batch-queries``, and scores them in one engine call on a
single worker thread (verl's tool sends one query per request, ~100 at a time). The event loop never scores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict

from recipe.arguments import POSITIVE
from recipe.search.engine import MAX_TOPK, Hit, IndexLoadError, SearchEngine

log = logging.getLogger("recipe.search.server")

DEFAULT_TOPK: Final = 3
DEFAULT_MAX_QUERIES: Final = 8192
DEFAULT_MAX_QUERY_CHARS: Final = 4096
DEFAULT_BATCH_WAIT_MS: Final = 2.0
DEFAULT_MAX_BATCH_QUERIES: Final = 1024


@dataclass(frozen=True)
class Settings:
    default_topk: int = DEFAULT_TOPK
    max_topk: int = MAX_TOPK
    max_queries: int = DEFAULT_MAX_QUERIES
    max_query_chars: int = DEFAULT_MAX_QUERY_CHARS
    batch_wait_ms: float = DEFAULT_BATCH_WAIT_MS
    max_batch_queries: int = DEFAULT_MAX_BATCH_QUERIES
    coalesce: bool = True


class RetrieveRequest(BaseModel):
    model_config = ConfigDict(strict=True)

    queries: list[str]
    topk: int | None = None
    return_scores: bool = True


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


def check_request(request: RetrieveRequest, settings: Settings) -> int:
    """The request's topk; BadRequest naming the field when it is out of the server's limits."""
    topk = settings.default_topk if request.topk is None else request.topk
    if topk < 1 or topk > settings.max_topk:
        raise BadRequest(f"topk: must be between 1 and {settings.max_topk} (--max-topk), got {topk}")
    if len(request.queries) > settings.max_queries:
        raise BadRequest(
            f"queries: {len(request.queries)} queries in one request, the limit is {settings.max_queries} "
            "(--max-queries); split the batch",
            status=413,
        )
    for i, query in enumerate(request.queries):
        if len(query) > settings.max_query_chars:
            raise BadRequest(
                f"queries[{i}]: {len(query)} characters, the limit is {settings.max_query_chars} (--max-query-chars)",
                status=413,
            )
    return topk


def describe_validation(errors: Sequence[Any]) -> tuple[int, str]:
    """Status and one message for pydantic's errors on a request body."""
    first = errors[0]
    if first.get("type") == "json_invalid":
        return 400, f"request body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}"
    loc = [part for part in first.get("loc", ()) if part != "body"]
    if not loc:
        return 422, 'request body: expected a JSON object {"queries": [str, ...], "topk": int, "return_scores": bool}'
    name = str(loc[0]) + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc[1:])
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return 422, f"{name}: {first.get('msg')}{more}"


@dataclass
class _Pending:
    queries: list[str]
    topk: int
    future: asyncio.Future[list[list[Hit]]]


@dataclass
class BatchStats:
    requests: int = 0
    queries: int = 0
    batches: int = 0
    largest_batch: int = 0
    search_seconds: float = 0.0


@dataclass
class MicroBatcher:
    """Coalesces concurrent requests into engine calls, one at a time on one worker thread."""

    engine: SearchEngine
    settings: Settings
    stats: BatchStats = field(default_factory=BatchStats)

    def __post_init__(self) -> None:
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bm25")
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="micro-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._executor.shutdown(wait=True)

    async def submit(self, queries: list[str], topk: int) -> list[list[Hit]]:
        self.stats.requests += 1
        if not self.settings.coalesce:
            async with self._lock:
                return await self._search([_Pending(queries, topk, asyncio.get_running_loop().create_future())])
        future: asyncio.Future[list[list[Hit]]] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(queries, topk, future))
        return await future

    async def _search(self, batch: list[_Pending]) -> list[list[Hit]]:
        queries = [q for p in batch for q in p.queries]
        ks = [p.topk for p in batch for _ in p.queries]
        started = time.perf_counter()
        hits = await asyncio.get_running_loop().run_in_executor(self._executor, self.engine.hits, queries, ks)
        self.stats.search_seconds += time.perf_counter() - started
        self.stats.batches += 1
        self.stats.queries += len(queries)
        self.stats.largest_batch = max(self.stats.largest_batch, len(queries))
        return hits

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            size = len(batch[0].queries)
            deadline = loop.time() + self.settings.batch_wait_ms / 1000
            while size < self.settings.max_batch_queries:
                timeout = deadline - loop.time()
                try:
                    item = (
                        self._queue.get_nowait() if timeout <= 0 else await asyncio.wait_for(self._queue.get(), timeout)
                    )
                except (asyncio.QueueEmpty, TimeoutError):
                    break
                batch.append(item)
                size += len(item.queries)
            try:
                hits = await self._search(batch)
            except Exception as error:  # answered as a 500 to every request of the batch, and logged
                log.exception("search-server: search failed for a batch of %d queries", size)
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(error)
                continue
            start = 0
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_result(hits[start : start + len(pending.queries)])
                start += len(pending.queries)


def _json(body: object, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def create_app(engine: SearchEngine, settings: Settings) -> FastAPI:
    batcher = MicroBatcher(engine, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        try:
            yield
        finally:
            await batcher.stop()
            served = batcher.stats
            log.info(
                "search-server: served requests=%d queries=%d engine_calls=%d largest_batch=%d search_s=%.2f",
                served.requests,
                served.queries,
                served.batches,
                served.largest_batch,
                served.search_seconds,
            )

    app = FastAPI(title="recipe BM25 retrieval", lifespan=lifespan)
    app.state.batcher = batcher
    app.state.engine = engine

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        status, message = describe_validation(exc.errors())
        return _json({"detail": message}, status)

    @app.exception_handler(BadRequest)
    async def _bad(request: Request, exc: BadRequest) -> Response:
        return _json({"detail": str(exc)}, exc.status)

    @app.get("/health")
    async def health() -> Response:
        stats = batcher.stats
        return _json(
            {
                "status": "ok",
                "passages": engine.passages,
                "index": engine.info(),
                "settings": settings.__dict__,
                "served": stats.__dict__,
            }
        )

    @app.post("/retrieve")
    async def retrieve(request: RetrieveRequest) -> Response:
        topk = check_request(request, settings)
        try:
            hits = await batcher.submit(request.queries, topk)
        except Exception as error:
            return _json({"detail": f"search failed: {type(error).__name__}: {error}"}, 500)
        result: list[list[Any]] = []
        for query_hits in hits:
            docs = [engine.document(h.row) for h in query_hits]
            if request.return_scores:
                result.append([{"document": d, "score": h.score} for d, h in zip(docs, query_hits, strict=True)])
            else:
                result.append(docs)
        return _json({"result": result})

    return app


DEFAULT_THREADS = min(8, len(os.sched_getaffinity(0)))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m recipe.search.server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", required=True, help="index folder built by python -m recipe.search.index")
    parser.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--default-topk", type=POSITIVE, default=DEFAULT_TOPK)
    parser.add_argument("--max-topk", type=POSITIVE, default=MAX_TOPK)
    parser.add_argument("--max-queries", type=POSITIVE, default=DEFAULT_MAX_QUERIES, help="queries per request")
    parser.add_argument("--max-query-chars", type=POSITIVE, default=DEFAULT_MAX_QUERY_CHARS)
    parser.add_argument("--batch-wait-ms", type=float, default=DEFAULT_BATCH_WAIT_MS)
    parser.add_argument("--max-batch-queries", type=POSITIVE, default=DEFAULT_MAX_BATCH_QUERIES)
    parser.add_argument("--no-coalesce", action="store_true", help="one engine call per request (for comparison)")
    parser.add_argument(
        "--threads",
        type=POSITIVE,
        default=DEFAULT_THREADS,
        help=f"numba threads per engine call, each taking a share of the batch's queries (default {DEFAULT_THREADS}, "
        "the usable cores up to 8)",
    )
    parser.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.default_topk > args.max_topk:
        print(f"error: --default-topk {args.default_topk} is above --max-topk {args.max_topk}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    try:
        engine = SearchEngine(args.index, max_topk=args.max_topk, n_threads=args.threads)
    except IndexLoadError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    warmup_s = engine.warmup()
    settings = Settings(
        default_topk=args.default_topk,
        max_topk=args.max_topk,
        max_queries=args.max_queries,
        max_query_chars=args.max_query_chars,
        batch_wait_ms=args.batch_wait_ms,
        max_batch_queries=args.max_batch_queries,
        coalesce=not args.no_coalesce,
    )
    import uvicorn

    log.info(
        "search-server: index=%s passages=%d warmup_s=%.1f coalesce=%s url=http://%s:%d/retrieve",
        args.index,
        engine.passages,
        warmup_s,
        settings.coalesce,
        args.host,
        args.port,
    )
    config = uvicorn.Config(
        create_app(engine, settings),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        backlog=1024,
    )
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 1


if __name__ == "__main__":
    raise SystemExit(main())
