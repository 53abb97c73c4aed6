"""Outage or bug: whether trying again can help with an exception, and how to name one in a log line.

An *outage* (network, a timeout, a 5xx/429/408, a store that is ``unavailable``) is retried; anything else is a
*bug*, tried once and logged with its type, place (``fault_fields``) and traceback. ``is_outage`` applies the rules,
first match wins; they and why: docs/decisions/0058-outage-or-bug.md."""

from __future__ import annotations

import errno
import os
import socket
import urllib.error
from typing import Final

from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, NotSupportedError, ProgrammingError

from guardian.redact import printable, scrub_text

# errnos of a resource that is exhausted or unreachable for now (the ConnectionError and TimeoutError
# errnos - refused, reset, aborted, broken pipe, timed out - come as those subclasses already)
TRANSIENT_ERRNOS: Final = frozenset(
    {
        errno.EAGAIN,
        errno.EWOULDBLOCK,
        errno.EINTR,
        errno.EBUSY,
        errno.ENOBUFS,
        errno.ENOMEM,
        errno.EMFILE,
        errno.ENFILE,
        errno.ENOSPC,
        errno.EDQUOT,
        errno.ESTALE,
        errno.ENETDOWN,
        errno.ENETUNREACH,
        errno.ENETRESET,
        errno.EHOSTDOWN,
        errno.EHOSTUNREACH,
        errno.EADDRNOTAVAIL,
    }
)
# exception types that name a mistake in the code that raised them, not in the world around it
BUG_TYPES: Final = (
    TypeError,
    ValueError,
    LookupError,
    AttributeError,
    NameError,
    AssertionError,
    ArithmeticError,
    NotImplementedError,
    RecursionError,
    ImportError,
)
_PACKAGE: Final = os.path.dirname(__file__)  # frames of guardian code have file names under it


def unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database cannot take work now (locked, full, I/O error, damaged, unreachable: also
    a PostgreSQL server refusing connections, shutting down or restarted under the store, a lock timeout) rather than
    that the call itself is wrong (a constraint, bad SQL, a value the column refuses)."""
    wrong_call = (IntegrityError, ProgrammingError, DataError, NotSupportedError)
    return isinstance(exc, DBAPIError) and not isinstance(exc, wrong_call)


def transient_status(status: int) -> bool:
    """Whether an HTTP answer may change on a later try: a server error, too many requests, a request timeout."""
    return status >= 500 or status in (408, 429)


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` is an outage, retried, rather than a bug, not (the rules: the module docstring)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        verdict = _verdict(current)
        if verdict is not None:
            return verdict
        current = current.__cause__ or current.__context__
    return False


def place(exc: BaseException) -> str | None:
    """``guardian/notify/compose.py:87``: where in guardian code ``exc`` was raised, the innermost frame of its
    traceback that is ours (a library's frames below it name no line a guardian developer can fix); None when
    no frame of its traceback is guardian code."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if filename.startswith(_PACKAGE + os.sep):
            found = f"guardian/{os.path.relpath(filename, _PACKAGE).replace(os.sep, '/')}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found


def fault_fields(exc: BaseException) -> dict[str, str]:
    """The log fields that name a failure: its ``type``, its place (``at``, see ``place``) and ``detail`` (the
    type and the message's first line, scrubbed as the store's errors are)."""
    return {"type": type(exc).__name__, "at": place(exc) or "outside guardian code", "detail": failure_text(exc)}


def _verdict(exc: BaseException) -> bool | None:
    """Rules 1-5 of the module docstring for ``exc`` alone; None when it is to be judged by what lies beneath."""
    retryable = getattr(exc, "retryable", None)
    if isinstance(retryable, bool):
        return retryable
    if isinstance(exc, DBAPIError):
        return unavailable(exc)
    status = _http_status(exc)
    if status is not None:
        return transient_status(status)
    if isinstance(exc, ConnectionError | TimeoutError | socket.gaierror):
        return True
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc.errno in TRANSIENT_ERRNOS
    if isinstance(exc, BUG_TYPES):
        return False
    return None


def _http_status(exc: BaseException) -> int | None:
    """The HTTP status an error carries: urllib's ``HTTPError.code``, ``status_code`` on the error
    (grafana-client) or on its ``response`` (httpx, requests, niquests); None without one."""
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code
    for holder in (exc, getattr(exc, "response", None)):
        status = getattr(holder, "status_code", None)
        if isinstance(status, int) and 100 <= status <= 599:
            return status
    return None


def failure_text(exc: BaseException) -> str:
    """``TypeName: first line of the message`` (just the type when there is no message): a failed tick in one
    log line, scrubbed as the store's errors are (no SQL text or parameters, no password of a URL)."""
    shown = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    lines = str(shown).strip().splitlines()  # the first line only: SQLAlchemy puts the SQL text on the lines after it
    return printable(scrub_text(f"{type(shown).__name__}: {lines[0] if lines else ''}".rstrip(": ")))
