"""The ``/metrics`` WSGI app: each exposition rendered once per snapshot, not once per scrape.

Rendering the text format costs milliseconds of Python; twenty scrapers re-rendering the same state
would queue behind each other and behind the guard loop. ``ExpositionApp`` keeps the rendered bytes
(per content type, plain or gzip, as ``prometheus_client`` negotiates them) for as long as its source
hands out the same snapshot sequence *object*; a new object (a tick published) renders afresh. A
source that builds a new sequence per call simply gets a fresh rendering per scrape.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector

from guardian.sinks.snapshot import ExportSource, RunSnapshot

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


class ExpositionApp:
    """A WSGI app serving ``source``'s snapshots through ``registry_for`` (the snapshots -> a registry
    whose collector exposes them), from a cache of rendered bodies (see the module docstring)."""

    def __init__(self, source: ExportSource, registry_for: Callable[[Sequence[RunSnapshot]], Collector]) -> None:
        self._source = source
        self._registry_for = registry_for
        self._lock = threading.Lock()  # guards the cache's two fields only, never held while rendering
        self._rendered_for: Sequence[RunSnapshot] | None = None
        self._bodies: dict[tuple[str, bool], bytes] = {}

    def body(self, accept: str, accept_encoding: str) -> tuple[bytes, list[tuple[str, str]]]:
        """The exposition of the source's current snapshots in the negotiated format, and its headers."""
        snapshots = self._source.snapshot()
        encoder, content_type = choose_encoder(accept)
        zipped = gzip_accepted(accept_encoding)
        key = (content_type, zipped)
        with self._lock:
            if snapshots is not self._rendered_for:
                self._rendered_for, self._bodies = snapshots, {}
            body = self._bodies.get(key)
        if body is None:
            body = encoder(self._registry_for(snapshots))
            if zipped:
                body = gzip.compress(body)
            with self._lock:
                if snapshots is self._rendered_for:
                    self._bodies[key] = body
        headers = [("Content-Type", content_type)]
        if zipped:
            headers.append(("Content-Encoding", "gzip"))
        return body, headers

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        allow = [("Allow", "OPTIONS,GET")]
        if method == "OPTIONS":
            start_response("200 OK", allow)
            return [b""]
        if method != "GET":
            start_response("405 Method Not Allowed", allow)
            return [f"# HTTP 405: {method}; use OPTIONS or GET\n".encode()]
        body, headers = self.body(environ.get("HTTP_ACCEPT", ""), environ.get("HTTP_ACCEPT_ENCODING", ""))
        start_response("200 OK", headers)
        return [body]
