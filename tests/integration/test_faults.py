"""guardian.faults: which exceptions are outages (retried) and which are bugs (not), and how a log line names
one (type and place). Real transports where a failure can be had on loopback: urllib, httpx, niquests."""

from __future__ import annotations

import errno
import socket
import sqlite3
import ssl
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from email.message import Message
from pathlib import Path
from typing import Literal

import httpx
import niquests
import pytest
from conftest import free_port
from grafana_client.client import GrafanaClientError, GrafanaException, GrafanaServerError
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, ProgrammingError

from guardian.dashboards import grafana
from guardian.dashboards.grafana import GrafanaError
from guardian.faults import fault_fields, is_outage, place, transient_status
from guardian.notify.notifiers import NotifyError


def chained(outer: BaseException, inner: BaseException, link: Literal["from", "while", "from None"]) -> BaseException:
    """``outer`` raised while handling ``inner``: ``from`` it, implicitly (as libraries wrap), or ``from None``."""
    try:
        try:
            raise inner
        except BaseException as caught:
            if link == "from":
                raise outer from caught
            if link == "from None":
                raise outer from None
            raise outer  # noqa: B904  # the implicit chain is the case under test
    except BaseException as exc:
        return exc
    raise AssertionError("unreachable")


def http_error(status: int) -> urllib.error.HTTPError:
    return urllib.error.HTTPError("http://127.0.0.1/hook", status, "answer", Message(), None)


def niquests_error(status: int) -> niquests.exceptions.HTTPError:
    response = niquests.Response()
    response.status_code = status
    return niquests.exceptions.HTTPError("answer", response=response)


def httpx_error(status: int) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://127.0.0.1/hook")
    return httpx.HTTPStatusError("answer", request=request, response=httpx.Response(status, request=request))


def db_error(kind: type[DBAPIError], orig: Exception) -> DBAPIError:
    """What SQLAlchemy raises for the driver's ``orig``."""
    return kind("INSERT INTO deliveries ...", {}, orig)


OUTAGES: dict[str, BaseException] = {
    "connection refused": ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
    "connection reset": ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"),
    "broken pipe": BrokenPipeError(errno.EPIPE, "Broken pipe"),
    "a bare ConnectionError": ConnectionError("receiver at http://127.0.0.1:9/… refused the connection"),
    "timeout": TimeoutError("timed out"),
    "EAGAIN": OSError(errno.EAGAIN, "Resource temporarily unavailable"),
    "network unreachable": OSError(errno.ENETUNREACH, "Network is unreachable"),
    "no route to host": OSError(errno.EHOSTUNREACH, "No route to host"),
    "disk full": OSError(errno.ENOSPC, "No space left on device"),
    "too many open files": OSError(errno.EMFILE, "Too many open files"),
    "resolver down": socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"),
    "host not found (the resolver may be down)": socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
    "HTTP 500 (urllib)": http_error(500),
    "HTTP 503 (urllib)": http_error(503),
    "HTTP 429 (urllib)": http_error(429),
    "HTTP 408 (urllib)": http_error(408),
    "HTTP 502 (niquests)": niquests_error(502),
    "HTTP 503 (httpx)": httpx_error(503),
    "HTTP 429 (httpx)": httpx_error(429),
    "Grafana 5xx (grafana-client)": GrafanaServerError(502, {"message": "bad gateway"}, "Server Error 502"),
    "a notifier's transport error": NotifyError("webhook hook: cannot deliver: Connection refused"),
    "Grafana unreachable": GrafanaError("add annotation: Grafana unreachable", retryable=True),
    "store locked": db_error(OperationalError, sqlite3.OperationalError("database is locked")),
    "store disk I/O error": db_error(OperationalError, sqlite3.OperationalError("disk I/O error")),
    "a library's wrapper over a refused connection": chained(
        RuntimeError("cannot publish"), ConnectionRefusedError(errno.ECONNREFUSED, "refused"), "while"
    ),
    "raised from a timeout": chained(RuntimeError("alert failed"), TimeoutError(), "from"),
    "a wrapper that hid its cause (from None, as httpcore does)": chained(
        RuntimeError("cannot deliver"), ConnectionRefusedError(errno.ECONNREFUSED, "refused"), "from None"
    ),
}
BUGS: dict[str, BaseException] = {
    "TypeError": TypeError("unsupported operand type(s) for +: 'int' and 'str'"),
    "KeyError": KeyError("evidence"),
    "ValueError": ValueError("Unknown format code 'd' for object of type 'float'"),
    "AttributeError": AttributeError("'NoneType' object has no attribute 'label'"),
    "IndexError": IndexError("list index out of range"),
    "ZeroDivisionError": ZeroDivisionError("division by zero"),
    "AssertionError": AssertionError(),
    "NotImplementedError": NotImplementedError(),
    "ImportError": ImportError("No module named 'wandb'"),
    "a plain RuntimeError": RuntimeError("bug in a sink"),
    "a plain Exception": Exception("something"),
    "file not found": FileNotFoundError(errno.ENOENT, "No such file or directory"),
    "permission denied": PermissionError(errno.EACCES, "Permission denied"),
    "bad certificate": ssl.SSLCertVerificationError(1, "certificate verify failed"),
    "HTTP 400 (urllib)": http_error(400),
    "HTTP 401 (urllib)": http_error(401),
    "HTTP 404 (urllib)": http_error(404),
    "HTTP 403 (niquests)": niquests_error(403),
    "HTTP 404 (httpx)": httpx_error(404),
    "HTTP 400 (httpx)": httpx_error(400),
    "Grafana 4xx (grafana-client)": GrafanaClientError(404, {"message": "not found"}, "Client Error 404"),
    "grafana-client without a status": GrafanaException(0, None, "odd"),
    "a notifier's refusal": NotifyError("webhook hook answered HTTP 404", retryable=False),
    "Grafana token rejected": GrafanaError("token rejected (401)", status=401),
    "store constraint violated": db_error(
        IntegrityError, sqlite3.IntegrityError("UNIQUE constraint failed: deliveries.event_key")
    ),
    "store SQL wrong": db_error(ProgrammingError, sqlite3.ProgrammingError("no such column: deliveries.nope")),
    "a bug while handling an outage": chained(
        KeyError("retry_in_s"), ConnectionRefusedError(errno.ECONNREFUSED, "refused"), "while"
    ),
    "a TypeError raised from a timeout": chained(TypeError("bad"), TimeoutError(), "from"),
    "a wrapper over a bug": chained(RuntimeError("delivery failed"), KeyError("x"), "from"),
}


@pytest.mark.parametrize("exc", OUTAGES.values(), ids=OUTAGES.keys())
def test_outages_are_retried(exc: BaseException) -> None:
    assert is_outage(exc)


@pytest.mark.parametrize("exc", BUGS.values(), ids=BUGS.keys())
def test_bugs_are_not(exc: BaseException) -> None:
    assert not is_outage(exc)


def test_a_cycle_of_contexts_ends() -> None:
    first, second = RuntimeError("a"), RuntimeError("b")
    first.__context__, second.__context__ = second, first
    assert not is_outage(first)


@pytest.mark.parametrize(("status", "transient"), [(500, True), (503, True), (429, True), (408, True), (400, False)])
def test_transient_status(status: int, transient: bool) -> None:
    assert transient_status(status) is transient


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def _failure(call: Callable[[], object]) -> BaseException:
    try:
        call()
    except Exception as exc:
        return exc
    raise AssertionError("the call did not fail")


def test_real_transport_failures_of_the_http_libraries(silent_port: int) -> None:
    closed = f"http://127.0.0.1:{free_port()}/hook"
    silent = f"http://127.0.0.1:{silent_port}/hook"
    refused = {
        "urllib": _failure(lambda: urllib.request.urlopen(closed, timeout=2)),
        "httpx": _failure(lambda: httpx.post(closed, timeout=2)),
        "niquests": _failure(lambda: niquests.post(closed, timeout=2)),
    }
    timed_out = {
        "httpx": _failure(lambda: httpx.post(silent, timeout=0.2)),
        "niquests": _failure(lambda: niquests.post(silent, timeout=0.2)),
    }
    # what the libraries raise is their own type, wrapping the socket's error
    assert isinstance(refused["httpx"], httpx.ConnectError) and isinstance(timed_out["httpx"], httpx.ReadTimeout)
    assert all(is_outage(exc) for exc in [*refused.values(), *timed_out.values()]), {**refused, **timed_out}
    mistakes = [
        _failure(lambda: httpx.post(f"ftp://127.0.0.1:{silent_port}/hook", timeout=1)),  # UnsupportedProtocol
        _failure(lambda: niquests.post("http://", timeout=1)),  # InvalidURL
        _failure(lambda: urllib.request.urlopen("nope://127.0.0.1/hook", timeout=1)),  # unknown url type
    ]
    assert not any(is_outage(exc) for exc in mistakes), mistakes


def test_the_place_is_the_innermost_frame_of_guardian_code() -> None:
    exc = _failure(lambda: grafana.connect(123, "token", timeout_s=1))  # type: ignore[arg-type]  # urllib raises
    innermost = traceback.extract_tb(exc.__traceback__)[-1]
    assert "urllib" in innermost.filename  # raised deep in the standard library
    at = place(exc)
    assert at is not None
    path, line = at.rsplit(":", 1)
    assert path == "guardian/dashboards/grafana.py"
    assert "urlsplit(url)" in Path(grafana.__file__).read_text().splitlines()[int(line) - 1]
    assert fault_fields(exc) == {
        "type": "AttributeError",
        "at": at,
        "detail": "AttributeError: 'int' object has no attribute 'decode'",
    }


def test_an_exception_from_outside_guardian_code_says_so() -> None:
    exc = _failure(lambda: {}["missing"])
    assert place(exc) is None and place(KeyError("never raised")) is None
    assert fault_fields(exc) == {"type": "KeyError", "at": "outside guardian code", "detail": "KeyError: 'missing'"}


def test_the_detail_keeps_a_database_error_to_its_first_line() -> None:
    exc = db_error(IntegrityError, sqlite3.IntegrityError("UNIQUE constraint failed: deliveries.event_key"))
    assert fault_fields(exc)["detail"] == "IntegrityError: UNIQUE constraint failed: deliveries.event_key"
