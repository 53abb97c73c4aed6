"""The config a verl run printed at its start (TaskRunner's ``pprint``), read from the attempt's stdout log:
the effective config, a launch script's own arguments included. Only the printing actor's lines are joined;
anything that does not read back as a Python literal is passed over."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

MAX_HEAD_BYTES = 16 << 20  # verl prints its config before the first step; start-up logs before it are a few MB
MAX_CONFIG_LINES = 20_000  # verl 0.9.1's printed config is ~1,000 lines
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_RAY_PREFIX = re.compile(r"\([^()]*\bpid=\d+[^()]*\) ?")


def read_printed_config(stdout: Path) -> dict[str, Any] | None:
    """The first printed config (a dict with a ``trainer`` section) in the head of ``stdout``; None when none."""
    try:
        with stdout.open("rb") as handle:
            head = handle.read(MAX_HEAD_BYTES)
    except OSError:
        return None
    return printed_config(head.decode("utf-8", errors="replace"))


def printed_config(text: str) -> dict[str, Any] | None:
    """The first ``{'…': …}`` literal with a ``trainer`` section printed in ``text`` (a console log)."""
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    for start, line in enumerate(lines):
        match = _RAY_PREFIX.match(line)
        prefix = match.group(0) if match else ""
        if not line[len(prefix) :].startswith("{'"):
            continue
        found = _literal_from(lines, start, prefix)
        if isinstance(found, dict) and isinstance(found.get("trainer"), dict):
            return found
    return None


def _literal_from(lines: list[str], start: int, prefix: str) -> object:
    """The literal that starts at ``lines[start]``, joined from the lines with the same actor prefix."""
    chunk: list[str] = []
    for line in lines[start : start + MAX_CONFIG_LINES]:
        if prefix and not line.startswith(prefix):
            continue  # another actor's line, interleaved
        chunk.append(line[len(prefix) :])
        if chunk[-1].rstrip().endswith("}"):
            try:
                return ast.literal_eval("\n".join(chunk))
            except (SyntaxError, ValueError, MemoryError, RecursionError):
                continue
    return None
