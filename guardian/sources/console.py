"""Read verl's ``console`` logger from a captured stdout log (facts §2): a fallback to the JSONL.

Parses ``step:N - k1:v1 - ...`` lines, numpy reprs (``np.float64(0.1)``) and ``nan`` included, with or without a
Ray actor prefix and ANSI colour. Other lines pass quietly; a malformed ``k:v`` pair is skipped, not its line."""

from __future__ import annotations

import math
import re
from pathlib import Path

from guardian.config import MAX_LINE_BYTES
from guardian.core import MAX_STEP, StepRecord, valid_step
from guardian.sources.jsonl import BadLine, MetricsFile, Pieces, read_in_pieces
from guardian.sources.tail import MAX_POLL_BYTES, OversizedLine

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Ray's per-actor prefix: "(TaskRunnerV1 pid=1543)", "(pid=2122)", "(TaskRunner pid=1, ip=10.0.0.1)"
_RAY_PREFIX = re.compile(r"\([^()]*\bpid=\d+[^()]*\)\s*")
_STEP = re.compile(r"step:(\d+)(?: - |\s*$)")
# pprint of a numpy scalar: np.float64(0.5), np.int32(4), numpy.float32(nan)
_NUMPY_SCALAR = re.compile(r"(?:np|numpy)\.[A-Za-z_][A-Za-z0-9_]*\((.*)\)")
_PAIR_SEPARATOR = " - "


def console_value(text: str) -> float | None:
    """A printed number as a float (``math.nan`` if non-finite); None if it is not a plain number."""
    text = text.strip()
    wrapped = _NUMPY_SCALAR.fullmatch(text)
    if wrapped is not None:
        text = wrapped.group(1).strip()
    try:
        value = float(text)  # accepts 1e-05, nan, inf, -inf; rejects True/False, reprs, names
    except (ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else math.nan


def parse_console_line(line: str) -> StepRecord | None:
    """The metrics of one console line, or None if the line is not a ``step:N - ...`` line; ``BadLine`` when its step
    is past ``MAX_STEP``."""
    text = _ANSI.sub("", line).rstrip("\r\n")
    text = text.rsplit("\r", 1)[-1].strip()  # a carriage return redraws the line: the last part shows
    prefix = _RAY_PREFIX.match(text)
    if prefix is not None:
        text = text[prefix.end() :]
    head = _STEP.match(text)
    if head is None:
        return None
    step = int(head.group(1))
    if not valid_step(step):
        raise BadLine(f"step {head.group(1)[:40]} is past {MAX_STEP}, the largest step kept")
    data: dict[str, float] = {}
    for pair in text[head.end() :].split(_PAIR_SEPARATOR):
        key, colon, raw = pair.rpartition(":")
        key = key.strip()
        if not colon or not key:
            continue
        value = console_value(raw)
        if value is not None:
            data[key] = value
    return StepRecord(step=step, data=data)


class ConsoleFile(MetricsFile):
    """Tail a stdout log and return the metric lines in it, like ``MetricsFile`` does for the JSONL.

    Non-metric lines are skipped without a report; only lines too long to keep are reported as bad.
    """

    def _parse(self, item: bytes | OversizedLine) -> StepRecord | None:
        if isinstance(item, OversizedLine):
            raise BadLine(f"line longer than {self._max_line} bytes, skipped")
        return parse_console_line(item.decode("utf-8", errors="replace"))


def iter_console_records(
    path: Path, *, max_poll_bytes: int = MAX_POLL_BYTES, max_line_bytes: int = MAX_LINE_BYTES
) -> Pieces:
    """Replay a finished stdout log in bounded pieces, like ``jsonl.iter_records`` does for the JSONL."""
    source = ConsoleFile(Path(path), max_poll_bytes=max_poll_bytes, max_line_bytes=max_line_bytes)
    return read_in_pieces(source, "console log")
