"""Logging set-up (called by the CLI only; nothing logs at import) and stable event lines.

Event lines read ``event=<name> key=value ...`` so that they can be grepped and parsed; values with
spaces are quoted. Logs go to stderr, leaving stdout to ``--json`` documents and the live view.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping

LOGGER_NAME = "guardian"


def init_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger(LOGGER_NAME)
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"{LOGGER_NAME}.{name}")


def _quote(value: object) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' "='):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def event(name: str, fields: Mapping[str, object]) -> str:
    """``event=name k=v ...`` with None values left out."""
    parts = [f"event={name}"]
    parts.extend(f"{k}={_quote(v)}" for k, v in fields.items() if v is not None)
    return " ".join(parts)
