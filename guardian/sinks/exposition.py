"""The ``/metrics`` WSGI app: each exposition rendered once per snapshot, not once per scrape.

``ExpositionApp`` keeps the rendered bytes (per content type, plain or gzip) while its source hands out the same
snapshot sequence *object*; a new object renders afresh. Why: docs/decisions/0054-scrapes-serve-the-tick-snapshot.md."""

from __future__ import annotations

import gzip
import io
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client.exposition import ThreadingWSGIServer, choose_encoder, gzip_accepted
from prometheus_client.registry import Collector

from guardian.logs import event, get_logger
from guardian.sinks.snapshot import ExportSource, RunSnapshot

log = get_logger("export")

# Connections served at once (a thread each): Prometheus servers and people with curl, with room to spare.
MAX_CONNECTIONS: Final = 64
# Seconds a connection has to send its whole request, and again to take the answer (a scrape takes milliseconds).
REQUEST_TIMEOUT_S: Final = 10.0

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


class BoundedServer(ThreadingWSGIServer):
    """A thread per connection, at most ``max_connections`` of them at once: one beyond is closed at once (the
    scraper retries at its next interval); a client that timed out or went away is no error worth a traceback."""

    max_connections: int = MAX_CONNECTIONS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._capped_said = False

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            if not self._capped_said:
                self._capped_said = True
                fields = {"max": self.max_connections, "then": "closing the connections beyond it at once"}
                log.warning(event("exporter_connections_capped", fields))
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], TimeoutError | ConnectionError):
            return  # an idle or slow client cut off, or one that hung up
        super().handle_error(request, client_address)


class _DeadlineReader(io.RawIOBase):
    """The request side of a connection: every read waits only for what is left of the request's deadline, so a
    drip-fed request cannot extend it; each read leaves the socket's timeout at ``write_timeout_s`` for the answer."""

    def __init__(self, sock: socket.socket, deadline: float, write_timeout_s: float) -> None:
        self._sock = sock
        self._deadline = deadline
        self._write_timeout_s = write_timeout_s

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request was not sent in time")
        self._sock.settimeout(left)
        try:
            return self._sock.recv_into(buffer)
        finally:
            self._sock.settimeout(self._write_timeout_s)


class TimedHandler(WSGIRequestHandler):
    """``request_timeout_s`` in all to send the request (headers and all), and as long to take the answer."""

    request_timeout_s: float = REQUEST_TIMEOUT_S

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.request_timeout_s)  # until the first read
        self.rfile.close()  # the buffered file over the socket, replaced by one with a deadline
        deadline = time.monotonic() + self.request_timeout_s
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, deadline, self.request_timeout_s))
