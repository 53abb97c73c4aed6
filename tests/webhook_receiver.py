"""A loopback webhook receiver (a Slack-compatible endpoint stand-in) for the notifier tests.

Paths choose the answer: /ok... 200, /fail... 500 echoing its path, /slow... waits for ``release``,
/moved... 302; ``answers`` are statuses answered first, one per request, whatever the path (a receiver
that is busy or refuses a while). Every request is recorded (method, path, content type, raw body).
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest


@dataclass
class Receiver:
    port: int
    requests: list[dict[str, object]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    answers: list[int] = field(default_factory=list)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A loopback HTTP server: /ok… answers 200, /fail… 500 echoing its path, /slow… waits, /moved… 302."""
    with receiving() as state:
        yield state


@contextmanager
def receiving(port: int = 0) -> Iterator[Receiver]:
    """The ``receiver`` fixture's server, for any scope; on ``port`` (0: any free one)."""
    state = Receiver(port=port)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            state.requests.append(
                {"method": self.command, "path": self.path, "content_type": self.headers["Content-Type"], "body": body}
            )
            if self.path.startswith("/slow"):
                state.release.wait(10)
            status, reply = 200, b"ok"
            if state.answers:
                status, reply = state.answers.pop(0), b"answered as told"
            elif self.path.startswith("/fail"):
                status, reply = 500, f"no such hook: {self.path}".encode()
            elif self.path.startswith("/moved"):
                self.send_response(302)
                self.send_header("Location", f"http://127.0.0.1:{state.port}/ok{self.path}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(status)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: object) -> None:
            return None

    class Server(http.server.ThreadingHTTPServer):
        def handle_error(self, request: object, client_address: object) -> None:
            return None  # a client that gave up (the timeout test) is not an error here

    server = Server(("127.0.0.1", port), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


def bodies(receiver: Receiver) -> list[dict[str, object]]:
    """The JSON bodies the receiver got, in order."""
    return [json.loads(bytes(r["body"])) for r in receiver.requests]  # type: ignore[arg-type]
