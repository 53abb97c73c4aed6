"""HTTP retrieval server over a BM25 index: the ``/retrieve`` API of Search-R1 and verl's search tool.

    python -m recipe.search.server --index DIR [--host 127.0.0.1] [--port 8000] [--default-topk 3] [--max-topk 50]

``POST /retrieve`` ``{"queries": [...], "topk": 3, "return_scores": true}`` answers
``{"result": [[{"document": {"id", "contents"}, "score": s}, ...], ...]}``, one list per query, best first (with
``return_scores`` false, bare documents); ``topk`` is optional (``--default-topk``). ``GET /health`` gives the
passage count and the index's manifest. A bad request gets a 4xx ``{"detail": "..."}`` naming the field.

Requests are coalesced: a micro-batcher gathers the queries of requests that arrive while the engine is busy or
within ``--batch-wait-ms`` of the first, up to ``--max-batch-queries``, and scores them in one engine call on a
single worker thread (verl's tool sends one query per request, ~100 at a time). The event loop never scores.

Limits (each a flag), so that no client holds memory or a connection for long:

- a request body over ``--max-body-bytes`` gets a 413: refused unread when its Content-Length says so, cut off
  while it streams otherwise; the bodies being read or answered, all connections together, are held to
  ``--max-body-bytes-in-flight`` (a 503 past it, which clients retry);
- deadlines from the start of each phase, which trickled bytes do not extend: a request head complete within
  ``--header-timeout`` of the connection's start (or of its first byte on a kept-alive connection), a body within
  ``--body-timeout`` of its head (408 and the connection closed); a kept-alive connection idle for ``--keep-alive``
  seconds is closed, one that leaves its answer unread for ``--send-timeout`` (the send buffer full) dropped;
- at most ``--max-connections`` connections (by default half the open-files limit, at most 16384): a new one past
  the cap closes the connection that has stalled longest (idle, or still sending a head or body), or gets a 503
  when every connection is busy with a search;
- a request head is at most 16 KiB (h11's own limit, a 400); a key other than ``queries``, ``topk`` and
  ``return_scores`` is a 422 naming it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import resource
import sys
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Final

import h11
import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict
from uvicorn.protocols.http.h11_impl import H11Protocol

from recipe.arguments import POSITIVE, POSITIVE_SECONDS
from recipe.search.engine import MAX_TOPK, Hit, IndexLoadError, SearchEngine

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger("recipe.search.server")

DEFAULT_TOPK: Final = 3
DEFAULT_MAX_QUERIES: Final = 8192
DEFAULT_MAX_QUERY_CHARS: Final = 4096
DEFAULT_BATCH_WAIT_MS: Final = 2.0
DEFAULT_MAX_BATCH_QUERIES: Final = 1024
DEFAULT_MAX_BODY_BYTES: Final = 16 * 1024 * 1024
DEFAULT_MAX_BODY_BYTES_IN_FLIGHT: Final = 256 * 1024 * 1024
DEFAULT_HEADER_TIMEOUT_S: Final = 10.0
DEFAULT_BODY_TIMEOUT_S: Final = 30.0
DEFAULT_KEEP_ALIVE_S: Final = 5.0
DEFAULT_SEND_TIMEOUT_S: Final = 30.0
CONNECTIONS_CEILING: Final = 16384


def default_max_connections() -> int:
    """Half the open-files limit (at most ``CONNECTIONS_CEILING``): past the limit accept() fails with EMFILE and
    nothing, /health included, gets through. The other half is for the sockets asyncio accepts in a burst before
    the cap can close them, the index, the logs and the loop. Memory is bounded apart from it: request heads by h11,
    bodies by ``--max-body-bytes-in-flight``."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return CONNECTIONS_CEILING
    return max(1, min(CONNECTIONS_CEILING, soft // 2))


DEFAULT_MAX_CONNECTIONS: Final = default_max_connections()
MAX_HEAD_BYTES: Final = 16 * 1024


@dataclass(frozen=True)
class Settings:
    default_topk: int = DEFAULT_TOPK
    max_topk: int = MAX_TOPK
    max_queries: int = DEFAULT_MAX_QUERIES
    max_query_chars: int = DEFAULT_MAX_QUERY_CHARS
    batch_wait_ms: float = DEFAULT_BATCH_WAIT_MS
    max_batch_queries: int = DEFAULT_MAX_BATCH_QUERIES
    coalesce: bool = True
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_body_bytes_in_flight: int = DEFAULT_MAX_BODY_BYTES_IN_FLIGHT
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S
    send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS


class RetrieveRequest(BaseModel):
    # extra="forbid": a misspelt key (top_k, return_score) is a 422 naming it, not a default silently used
    model_config = ConfigDict(strict=True, extra="forbid")

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
    # an unknown key first: {"query": ...} is better told as the misspelling than as "queries: Field required"
    first = next((error for error in errors if error.get("type") == "extra_forbidden"), errors[0])
    if first.get("type") == "json_invalid":
        return 400, f"request body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}"
    loc = [part for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "extra_forbidden" and len(loc) == 1:
        known = ", ".join(RetrieveRequest.model_fields)
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return 422, f"{loc[0]}: unknown key; a request has only {known}{more}"
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


def _raw_response(status: int, reason: str, detail: str) -> bytes:
    """A whole HTTP/1.1 response that closes the connection, for the protocol to write past the app."""
    body = orjson.dumps({"detail": detail})
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class BodyLimit:
    """ASGI middleware: an HTTP request body over ``max_bytes`` is answered 413 and the connection closed. A
    Content-Length over the limit is refused before a byte of the body is read; a chunked body is counted as it
    streams. The body under the limit is read here and handed on whole, so the app never sees more.

    The bodies of all requests in flight (read, or being read, and not yet answered) are held to
    ``max_in_flight`` bytes together: past it a request gets a 503 (clients retry), so many connections each under
    the per-request limit cannot add up to the memory one huge body would take."""

    def __init__(self, app: Any, max_bytes: int, max_in_flight: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_in_flight = max_in_flight
        self.in_flight = 0

    @staticmethod
    async def _refuse(send: Any, status: int, detail: str) -> None:
        body = orjson.dumps({"detail": detail})
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _too_large(self, send: Any) -> None:
        await self._refuse(send, 413, f"request body over {self.max_bytes} bytes (--max-body-bytes); split the batch")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = next((value for name, value in scope["headers"] if name == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(send)
            return
        chunks: list[bytes] = []
        size = 0
        try:
            while True:
                message = await receive()
                if message["type"] != "http.request":  # the client went away (or a body timeout closed it)
                    return
                chunk = message.get("body", b"")
                size += len(chunk)
                self.in_flight += len(chunk)
                if size > self.max_bytes:
                    await self._too_large(send)
                    return
                if self.in_flight > self.max_in_flight:
                    detail = (
                        f"server busy: request bodies in flight over {self.max_in_flight} bytes "
                        "(--max-body-bytes-in-flight); retry"
                    )
                    await self._refuse(send, 503, detail)
                    return
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
            whole: dict[str, Any] | None = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            chunks.clear()

            async def replay() -> Any:
                nonlocal whole
                if whole is not None:
                    message, whole = whole, None
                    return message
                return await receive()

            await self.app(scope, replay, send)
        finally:
            self.in_flight -= size


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the deadlines and the connection cap that uvicorn lacks: it arms its keep-alive
    timer only after a response, so a connection that never completes a head or a body is held for ever, and
    ``limit_concurrency`` answers 503 but still holds every connection (and its file descriptor).

    Each connection is in one phase: ``head`` (waiting for a request head: from the connection's start, or from
    the first byte after a kept-alive response), ``body`` (the head came, the body has not), ``app`` (the request
    is complete, the app is answering) or ``idle`` (kept alive between requests; uvicorn's keep-alive timer).
    ``head`` and ``body`` have a deadline from the phase's start that bytes do not push back. ``settings`` is set
    on a subclass per server (``protocol_for``)."""

    settings: ClassVar[Settings] = Settings()
    REFUSAL_LOG_EVERY_S: ClassVar[float] = 10.0
    _refusals: ClassVar[int] = 0
    _refusal_logged: ClassVar[float] = float("-inf")

    # a connection the server closes gets this long to flush what it was sent, then is aborted: asyncio's close()
    # waits for the peer to read the buffered bytes, so a client that reads nothing would keep it (and its fd)
    ABORT_AFTER_S: ClassVar[float] = 1.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase = ""
        self._since = 0.0
        self._deadline: asyncio.TimerHandle | None = None
        self._send_deadline: asyncio.TimerHandle | None = None
        self._abort: asyncio.TimerHandle | None = None

    # -- phases

    def _phase_now(self) -> str:
        state = self.conn.their_state
        if state is h11.IDLE:
            return "head" if self.cycle is None or self.conn.trailing_data[0] else "idle"
        if state is h11.SEND_BODY:
            return "body"
        return "app"

    def _sync(self) -> None:
        if self.transport is None or self.transport.is_closing():
            self._cancel()
            return
        phase = self._phase_now()
        if phase == self._phase:
            return  # the deadline runs from the phase's start, whatever bytes came since
        self._cancel()
        self._phase, self._since = phase, self.loop.time()
        timeout = {"head": self.settings.header_timeout_s, "body": self.settings.body_timeout_s}.get(phase)
        if timeout:
            self._deadline = self.loop.call_later(timeout, self._expired)

    def _cancel(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _close(self, status: int | None, reason: str, detail: str) -> None:
        self._cancel()
        if self.transport.is_closing():
            return
        if status is not None:
            self.transport.write(_raw_response(status, reason, detail))
        self.transport.close()
        self._abort_later()

    def _abort_later(self) -> None:
        if self._abort is None:
            self._abort = self.loop.call_later(min(self.ABORT_AFTER_S, self.settings.send_timeout_s), self._aborted)

    def _aborted(self) -> None:
        self._abort = None
        self.transport.abort()  # a no-op once the connection is gone

    def _expired(self) -> None:
        self._deadline = None
        if self._phase == "head":
            started = bool(self.conn.trailing_data[0])
            log.debug("search-server: closing %s: no request head in %ss", self.client, self.settings.header_timeout_s)
            detail = f"request head not complete in {self.settings.header_timeout_s} s (--header-timeout)"
            self._close(408 if started else None, "Request Timeout", detail)
        elif self._phase == "body":
            log.debug("search-server: closing %s: no request body in %ss", self.client, self.settings.body_timeout_s)
            detail = f"request body not complete in {self.settings.body_timeout_s} s (--body-timeout)"
            self._close(408, "Request Timeout", detail)

    @property
    def stalled(self) -> bool:
        """Waiting on the client (idle, or a head or body not complete) and not already closing."""
        return self._phase in ("head", "body", "idle") and not self.transport.is_closing()

    # -- the connection cap

    def _make_room(self) -> bool:
        """Below the cap after closing the longest-stalled other connection if needed; False when every other
        connection is busy with a request."""
        live = [c for c in self.connections if c is not self and not c.transport.is_closing()]
        if len(live) < self.settings.max_connections:
            return True
        # no minimum stall: a real client leaves the head phase within milliseconds, an attacker's connection stays
        stalled = [c for c in live if isinstance(c, LimitedH11Protocol) and c.stalled]
        if not stalled:
            return False
        victim = min(stalled, key=lambda c: c._since)
        log.debug("search-server: --max-connections %d reached: closing stalled %s", len(live), victim.client)
        mid_request = victim._phase == "body" or bool(victim.conn.trailing_data[0])
        detail = f"connection closed to make room (--max-connections {self.settings.max_connections})"
        victim._close(503 if mid_request else None, "Service Unavailable", detail)
        return True

    # -- asyncio.Protocol and uvicorn hooks

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self._make_room():
            cls = type(self)
            cls._refusals += 1
            if self.loop.time() - cls._refusal_logged >= self.REFUSAL_LOG_EVERY_S:  # one line per 10 s, not a flood
                cls._refusal_logged = self.loop.time()
                log.warning(
                    "search-server: at --max-connections %d with none stalled: %d connections refused with 503 so far",
                    self.settings.max_connections,
                    cls._refusals,
                )
            detail = f"{self.settings.max_connections} connections busy (--max-connections); retry"
            self._close(503, "Service Unavailable", detail)
            return
        self._sync()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._sync()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._sync()

    def timeout_keep_alive_handler(self) -> None:
        super().timeout_keep_alive_handler()
        self._abort_later()

    def pause_writing(self) -> None:
        """The send buffer is full: the client has this long (``send_timeout_s``) to read some of it."""
        super().pause_writing()
        if self._send_deadline is None:
            self._send_deadline = self.loop.call_later(self.settings.send_timeout_s, self._send_expired)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_deadline is not None:
            self._send_deadline.cancel()
            self._send_deadline = None

    def _send_expired(self) -> None:
        self._send_deadline = None
        log.debug("search-server: dropping %s: answer unread for %ss", self.client, self.settings.send_timeout_s)
        self._cancel()
        self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        for handle in (self._send_deadline, self._abort):
            if handle is not None:
                handle.cancel()
        self._send_deadline = self._abort = None
        super().connection_lost(exc)


def protocol_for(settings: Settings) -> type[LimitedH11Protocol]:
    """The protocol class of a server with ``settings`` (uvicorn builds one per connection from a class)."""
    return type("LimitedH11Protocol", (LimitedH11Protocol,), {"settings": settings})


def uvicorn_config(app: Any, settings: Settings, *, host: str, port: int, log_level: str = "info") -> uvicorn.Config:
    """The uvicorn config that enforces ``settings``' connection limits (the body limit is in ``create_app``)."""
    import uvicorn

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        backlog=1024,
        http=protocol_for(settings),
        timeout_keep_alive=settings.keep_alive_s,  # type: ignore[arg-type]  # call_later takes a float
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        # limit_concurrency stays off: it answers 503 but keeps holding the connection; the cap above closes
    )


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
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, max_in_flight=settings.max_body_bytes_in_flight)
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
    parser.add_argument(
        "--max-body-bytes",
        type=POSITIVE,
        default=DEFAULT_MAX_BODY_BYTES,
        help=f"largest request body, answered 413 past it (default {DEFAULT_MAX_BODY_BYTES})",
    )
    parser.add_argument(
        "--max-body-bytes-in-flight",
        type=POSITIVE,
        default=DEFAULT_MAX_BODY_BYTES_IN_FLIGHT,
        help="request bodies held at once, all connections together; a request past it gets a 503 (default "
        f"{DEFAULT_MAX_BODY_BYTES_IN_FLIGHT})",
    )
    parser.add_argument(
        "--header-timeout",
        type=POSITIVE_SECONDS,
        default=DEFAULT_HEADER_TIMEOUT_S,
        help=f"seconds for a request head to arrive (default {DEFAULT_HEADER_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--body-timeout",
        type=POSITIVE_SECONDS,
        default=DEFAULT_BODY_TIMEOUT_S,
        help=f"seconds for a request body to arrive after its head (default {DEFAULT_BODY_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--keep-alive",
        type=POSITIVE_SECONDS,
        default=DEFAULT_KEEP_ALIVE_S,
        help=f"seconds an idle kept-alive connection is held (default {DEFAULT_KEEP_ALIVE_S:g})",
    )
    parser.add_argument(
        "--send-timeout",
        type=POSITIVE_SECONDS,
        default=DEFAULT_SEND_TIMEOUT_S,
        help="seconds a client may leave an answer unread (the send buffer full) before its connection is dropped "
        f"(default {DEFAULT_SEND_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--max-connections",
        type=POSITIVE,
        default=None,
        help=f"connections held at once (default half the open-files limit, at most {CONNECTIONS_CEILING})",
    )
    parser.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    return parser


def settings_from(args: argparse.Namespace) -> Settings:
    return Settings(
        default_topk=args.default_topk,
        max_topk=args.max_topk,
        max_queries=args.max_queries,
        max_query_chars=args.max_query_chars,
        batch_wait_ms=args.batch_wait_ms,
        max_batch_queries=args.max_batch_queries,
        coalesce=not args.no_coalesce,
        max_body_bytes=args.max_body_bytes,
        max_body_bytes_in_flight=args.max_body_bytes_in_flight,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        keep_alive_s=args.keep_alive,
        send_timeout_s=args.send_timeout,
        max_connections=default_max_connections() if args.max_connections is None else args.max_connections,
    )


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
    settings = settings_from(args)
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
    config = uvicorn_config(
        create_app(engine, settings), settings, host=args.host, port=args.port, log_level=args.log_level
    )
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 1


if __name__ == "__main__":
    raise SystemExit(main())
