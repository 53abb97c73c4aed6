"""psycopg connections whose every round trip to the server is bounded in time (``store.statement_timeout_s``).

A server that stays connected but stops answering would block libpq for ever. ``BoundedConnection`` passes a
deadline to psycopg's wait (psycopg >= 3.3); past it the connection is closed and ``NoAnswer`` (an
``OperationalError``, so an outage) is raised. A commit cut off so has an unknown outcome; units are safe to replay.
Why: docs/ARCHITECTURE.md §8."""

from __future__ import annotations

import inspect
from typing import Any, Final

import psycopg
from psycopg import errors

WAIT_TIMEOUT: Final = "timeout"  # the keyword of Connection.wait this relies on
_WAIT_TIMEOUT: Final[type[errors.OperationalError] | None] = getattr(errors, "_WaitTimeout", None)
"""What psycopg's wait raises at its deadline (a private subclass of OperationalError; None before psycopg 3.3)."""


class NoAnswer(psycopg.OperationalError):
    """The server did not answer one round trip within the bound; the connection was closed."""


def bounded_waits_supported() -> bool:
    """Whether this psycopg's ``Connection.wait`` takes a deadline (3.3 and later do)."""
    return _WAIT_TIMEOUT is not None and WAIT_TIMEOUT in inspect.signature(psycopg.Connection.wait).parameters


class BoundedConnection(psycopg.Connection[Any]):
    """A psycopg connection whose round trips each end within ``answer_timeout_s`` seconds (None: no bound)."""

    answer_timeout_s: float | None = None

    def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
        bound = self.answer_timeout_s
        if bound is None:
            return super().wait(gen, *args, **kwargs)
        given = kwargs.get(WAIT_TIMEOUT)
        kwargs[WAIT_TIMEOUT] = bound if given is None else min(given, bound)
        try:
            return super().wait(gen, *args, **kwargs)
        except errors.OperationalError as exc:
            timed_out = _WAIT_TIMEOUT is not None and isinstance(exc, _WAIT_TIMEOUT)
            if not timed_out or (given is not None and given <= bound):
                raise  # the caller's own deadline (notifies, a cancel) or another failure: psycopg's error
            self.close()
            raise NoAnswer(
                f"the PostgreSQL server gave no answer within {bound:g} s (store.statement_timeout_s): it is hung or "
                "the network to it is down; the connection was closed and the next call opens a new one"
            ) from None
