"""Async client of the retrieval server's ``POST /retrieve`` (``recipe.search.server``, or Search-R1's own).

One instance may be used from several event loops over its life (verl starts agent loops in worker processes
and threads): it keeps one ``httpx.AsyncClient`` per running loop, created on first use in that loop. Call
``aclose()`` from a loop to close that loop's connections; clients of loops that have since closed are dropped.

Connection errors, timeouts and 5xx answers are retried ``retries`` times (so ``retries + 1`` attempts) with
exponential backoff from ``backoff_s``; a 4xx is not retried. Either way the failure is a ``RetrievalError``
naming the URL, what failed and after how many attempts.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import httpx

from recipe.search.passage import Passage, RetrievalError

__all__ = ["DEFAULT_RETRIEVAL_URL", "RetrievalClient", "RetrievalError", "parse_result"]

DEFAULT_RETRIEVAL_URL = "http://127.0.0.1:8000/retrieve"
"""where ``python -m recipe.search.server`` answers with its default host and port"""


def parse_result(body: Any, expected: int) -> list[list[Passage]]:
    """Passages per query from a ``/retrieve`` answer; ValueError when it is not ``{"result": [[...]]}``."""
    if not isinstance(body, dict) or not isinstance(body.get("result"), list):
        raise ValueError('expected a JSON object {"result": [[...], ...]}')
    result = body["result"]
    if len(result) != expected:
        raise ValueError(f"{len(result)} result lists for {expected} queries")
    passages: list[list[Passage]] = []
    for i, hits in enumerate(result):
        if not isinstance(hits, list):
            raise ValueError(f"result[{i}] is not a list")
        row: list[Passage] = []
        for j, hit in enumerate(hits):
            if not isinstance(hit, dict):
                raise ValueError(f"result[{i}][{j}] is not an object")
            document = hit.get("document", hit)  # return_scores false: bare documents
            if not isinstance(document, dict):
                raise ValueError(f"result[{i}][{j}].document is not an object")
            score = hit.get("score", 0.0)
            if not isinstance(score, int | float):
                raise ValueError(f"result[{i}][{j}].score is not a number")
            row.append(Passage.from_row(document, float(score)))
        passages.append(row)
    return passages


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return str(body)[:300]


class RetrievalClient:
    def __init__(self, url: str, *, timeout_s: float = 30.0, retries: int = 3, backoff_s: float = 0.5) -> None:
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.url = url
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )
        self._guard = threading.Lock()

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        with self._guard:
            for other in [lp for lp in self._clients if lp.is_closed()]:
                del self._clients[other]
            client = self._clients.get(loop)
            if client is None:
                client = httpx.AsyncClient(
                    timeout=self.timeout_s, limits=httpx.Limits(max_connections=256, max_keepalive_connections=64)
                )
                self._clients[loop] = client
            return client

    async def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        """Up to ``topk`` passages per query, best first, one list per query (``[]`` for none)."""
        queries = list(queries)
        if not queries:
            return []
        payload = {"queries": queries, "topk": topk, "return_scores": True}
        attempts = self.retries + 1
        last = ""
        for attempt in range(1, attempts + 1):
            try:
                response = await self._client().post(self.url, json=payload)
            except httpx.TimeoutException as error:
                last = f"timed out after {self.timeout_s:g}s ({type(error).__name__})"
            except httpx.TransportError as error:
                last = f"connection failed ({type(error).__name__}: {error})"
            else:
                if response.status_code >= 500:
                    last = f"server error {response.status_code}: {_detail(response)}"
                elif response.status_code >= 400:
                    raise RetrievalError(
                        f"{self.url}: request rejected with {response.status_code}: {_detail(response)} "
                        f"(attempt {attempt}, not retried)"
                    )
                else:
                    try:
                        return parse_result(response.json(), len(queries))
                    except ValueError as error:
                        raise RetrievalError(
                            f"{self.url}: unexpected answer ({error}) after {attempt} attempt(s)"
                        ) from None
            if attempt < attempts:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
        raise RetrievalError(f"{self.url}: {last}; gave up after {attempts} attempts")

    async def aclose(self) -> None:
        """Close this loop's connections (and forget clients of loops that have closed)."""
        loop = asyncio.get_running_loop()
        with self._guard:
            client = self._clients.pop(loop, None)
            for other in [lp for lp in self._clients if lp.is_closed()]:
                del self._clients[other]
        if client is not None:
            await client.aclose()
