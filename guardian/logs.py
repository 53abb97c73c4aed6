"""Logging set-up (called by the CLI only; nothing logs at import) and stable event lines.

Lines read ``event=<name> key=value ...`` (values with spaces quoted) on stderr; stdout is for ``--json`` and the
live view. Every line, tracebacks included, is scrubbed of the secret parts of opened database URLs
(``guardian.redact``)."""

from __future__ import annotations

import logging
import re
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from guardian.redact import scrub_remembered

LOGGER_NAME = "guardian"


FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
_terminal: logging.Handler | None = None


class _Formatter(logging.Formatter):
    """``FORMAT``, with the remembered secrets taken out of the whole record (message, traceback, stack)."""

    def format(self, record: logging.LogRecord) -> str:
        return scrub_remembered(super().format(record))


_terminal_level_chosen = False  # --log-level given: the terminal keeps it, story or not


def init_logging(level: str | None = None) -> None:
    """Log lines to stderr at ``level`` (INFO when None); ValueError for an unknown level name. ``level`` is the
    terminal's: a run's guardian.log (``logging_to_file``) still gets every INFO line."""
    global _terminal, _terminal_level_chosen
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(FORMAT))
    handler.setLevel((level or "INFO").upper())
    root = logging.getLogger(LOGGER_NAME)
    root.setLevel(min(handler.level, logging.INFO))
    for old in root.handlers:
        old.close()
    root.handlers[:] = [handler]
    root.propagate = False
    _terminal, _terminal_level_chosen = handler, level is not None


@contextmanager
def logging_to_file(
    path: Path, *, quiet_terminal: bool, quiet_level: int = logging.WARNING, only_run: str | None = None
) -> Iterator[Path]:
    """Every log line of the block also goes to ``path`` (appended). With ``quiet_terminal`` - a person reads the
    story the command prints - the terminal shows lines from ``quiet_level`` up only (warnings and errors by
    default), unless ``--log-level`` chose its level. ``only_run``: several runs are guarded in this process, the
    file takes the lines of this thread and the lines naming that run (``run=ID``) only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(_Formatter(FORMAT))
    if only_run is not None:
        handler.addFilter(_RunLines(threading.get_ident(), only_run))
    root = logging.getLogger(LOGGER_NAME)
    root.addHandler(handler)
    terminal, before = _terminal, _terminal.level if _terminal is not None else logging.NOTSET
    if quiet_terminal and terminal is not None and not _terminal_level_chosen:
        terminal.setLevel(quiet_level)
    try:
        yield path
    finally:
        root.removeHandler(handler)
        handler.close()
        if terminal is not None:
            terminal.setLevel(before)


class _RunLines(logging.Filter):
    """The lines of one run among several guarded in one process: its guard thread's, and any naming it."""

    def __init__(self, thread: int, run_id: str) -> None:
        super().__init__()
        self._thread = thread
        self._field = re.compile(f"(?:^| )run={re.escape(_quote(run_id))}(?: |$)")

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread == self._thread or self._field.search(record.getMessage()) is not None


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"{LOGGER_NAME}.{name}")


# characters that would break one event onto several lines or fake a field: escaped inside quotes (C1 too: NEL
# \x85 ends a line for str.splitlines, \x9b starts a terminal escape)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_control(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def _quote(value: object) -> str:
    """``value`` as one token: quoted (``\\``, ``"`` and control characters escaped) when it holds a space, a
    quote, ``=`` or a control character - a newline in a run id never forges a second log line."""
    text = str(value)
    if text == "" or any(c in text for c in ' "=') or _CONTROL.search(text):
        escaped = text.replace("\\", "\\\\").replace('"', '\\"')
        return '"' + _CONTROL.sub(_escape_control, escaped) + '"'
    return text


def event(name: str, fields: Mapping[str, object]) -> str:
    """``event=name k=v ...`` with None values left out."""
    parts = [f"event={name}"]
    parts.extend(f"{k}={_quote(v)}" for k, v in fields.items() if v is not None)
    return " ".join(parts)
