"""Read verl's ``file`` logger: one ``{"step":N,"data":{...}}`` object per line (facts §2).

verl writes compact orjson with NaN/±inf as ``null``; the calibration traces write the bare tokens
``NaN``/``Infinity`` instead, so a line orjson rejects is retried with the stdlib parser, which accepts
them. Only numbers are kept (as floats); a non-finite value, however written, becomes ``math.nan``.
A line that cannot be read is reported with its file, segment and line number and skipped: one bad
line never costs the good lines around it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from guardian.history import StepRecord
from guardian.keys import CHECKED_PREFIXES
from guardian.sources.tail import LineTail, NewSegment, OversizedLine

__all__ = [
    "BadLine",
    "BadLineReport",
    "MetricsBatch",
    "MetricsFile",
    "NewSegment",  # re-exported: consumers of MetricsBatch.items need it
    "iter_records",
    "metric_value",
    "parse_metrics_line",
    "read_all",
]


class BadLine(Exception):
    """A line that is not a metrics record; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class BadLineReport:
    """One unreadable line: where it is (``line_number`` counts from 1 within the segment) and why."""

    path: Path
    segment: int
    line_number: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line_number} (segment {self.segment}): {self.reason}"


@dataclass(frozen=True, slots=True)
class MetricsBatch:
    """Records and segment markers in file order, plus the lines that could not be read.

    ``more`` is True when the file held more than one poll may read; poll again.
    """

    items: list[StepRecord | NewSegment]
    bad_lines: list[BadLineReport]
    more: bool = False


def _excerpt(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _loads(line: bytes) -> object:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        pass
    try:  # the stdlib parser accepts NaN / Infinity / -Infinity and integers of any size
        return json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise BadLine(f"not JSON ({exc}): {_excerpt(line)}") from None


def _step(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        step = value
    elif isinstance(value, float) and value.is_integer():
        step = int(value)
    else:
        raise BadLine(f"'step' must be an integer, got {_excerpt(value)}")
    if step < 0:
        raise BadLine(f"'step' must be >= 0, got {step}")
    return step


def metric_value(value: object) -> float | None:
    """A JSON value as a metric: a float, ``math.nan`` for null/non-finite, None for non-numbers."""
    if value is None:
        return math.nan
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return value if math.isfinite(value) else math.nan
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:  # beyond float range: as good as infinite
            return math.nan
    return None


def parse_metrics_line(line: bytes, keys: frozenset[str] | None = None) -> StepRecord:
    """Parse one ``file`` logger line; raise ``BadLine`` if it is not a metrics record.

    ``keys`` keeps only those metrics, and those under ``keys.CHECKED_PREFIXES`` (a replay needs the ~60
    keys the checks read, not all 300).
    """
    obj = _loads(line)
    if not isinstance(obj, dict):
        raise BadLine(f"not a JSON object: {_excerpt(obj)}")
    if "step" not in obj:
        raise BadLine("no 'step' field")
    step = _step(obj["step"])
    if "data" not in obj:
        raise BadLine("no 'data' field")
    raw = obj["data"]
    if not isinstance(raw, dict):
        raise BadLine(f"'data' must be an object, got {_excerpt(raw)}")
    data: dict[str, float] = {}
    pairs = raw.items() if keys is None else _kept(raw, keys, prefixed=_PREFIX_BYTES.search(line) is not None)
    for key, value in pairs:
        kind = type(value)
        if kind is float:  # the common case first: no call per value on 300-key lines
            data[key] = value if value - value == 0.0 else math.nan
            continue
        number = metric_value(value)
        if number is not None:
            data[key] = number
    return StepRecord(step=step, data=data)


# a line holds a prefixed key only if its bytes do: one search instead of a test per key of 300-key lines
_PREFIX_BYTES = re.compile(b"|".join(re.escape(p.encode()) for p in CHECKED_PREFIXES))


def _kept(raw: dict[str, Any], keys: frozenset[str], *, prefixed: bool) -> list[tuple[str, Any]]:
    """The pairs of ``raw`` whose key is in ``keys`` or (``prefixed``) starts with one of ``CHECKED_PREFIXES``."""
    kept = [(k, raw[k]) for k in keys if k in raw]
    if prefixed:
        kept.extend((k, v) for k, v in raw.items() if k.startswith(CHECKED_PREFIXES))
    return kept


class MetricsFile:
    """Tail a ``file`` logger JSONL as it grows; each poll returns the new records.

    A new segment (the file was truncated or replaced: verl restarted) is marked with ``NewSegment``
    before its records; line numbers in reports restart at 1 with each segment.
    """

    def __init__(
        self,
        path: Path,
        *,
        chunk_bytes: int = 1 << 20,
        max_line_bytes: int = 16 << 20,
        max_poll_bytes: int = 4 << 20,
        keys: frozenset[str] | None = None,
    ) -> None:
        self._keys = keys
        self._tail = LineTail(
            path, chunk_bytes=chunk_bytes, max_line_bytes=max_line_bytes, max_poll_bytes=max_poll_bytes
        )
        self._max_line = max_line_bytes
        self._segment = 0
        self._line_number = 0

    @property
    def path(self) -> Path:
        return self._tail.path

    @property
    def segment(self) -> int:
        return self._tail.segment

    def poll(self, *, final: bool = False) -> MetricsBatch:
        """New records since the last poll; ``final=True`` also reads an unterminated last line."""
        batch = self._tail.poll(final=final)
        items: list[StepRecord | NewSegment] = []
        bad: list[BadLineReport] = []
        for item in batch.items:
            if isinstance(item, NewSegment):
                self._segment = item.segment
                self._line_number = 0
                items.append(item)
                continue
            self._line_number += 1
            try:
                record = self._parse(item)
            except BadLine as exc:
                bad.append(BadLineReport(self.path, self._segment, self._line_number, exc.reason))
                continue
            if record is not None:
                items.append(record)
        return MetricsBatch(items=items, bad_lines=bad, more=batch.more)

    def _parse(self, item: bytes | OversizedLine) -> StepRecord | None:
        if isinstance(item, OversizedLine):
            raise BadLine(f"line longer than {self._max_line} bytes, skipped")
        if not item.strip():
            return None  # a blank line carries nothing and is not worth a report
        return parse_metrics_line(item, self._keys)


def iter_records(
    path: Path, *, max_poll_bytes: int = 4 << 20, keys: frozenset[str] | None = None
) -> Iterator[tuple[list[StepRecord], list[BadLineReport]]]:
    """Replay a finished file in bounded pieces: each yield is one poll's records and bad lines."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"metrics file {path} does not exist")
    source = MetricsFile(path, max_poll_bytes=max_poll_bytes, keys=keys)
    while True:
        batch = source.poll(final=True)
        yield [item for item in batch.items if isinstance(item, StepRecord)], batch.bad_lines
        if not batch.more:
            return


def read_all(path: Path, *, max_poll_bytes: int = 4 << 20) -> tuple[list[StepRecord], list[BadLineReport]]:
    """Every record of a finished file, and its bad lines (the file is streamed, never slurped)."""
    records: list[StepRecord] = []
    bad: list[BadLineReport] = []
    for chunk_records, chunk_bad in iter_records(path, max_poll_bytes=max_poll_bytes):
        records.extend(chunk_records)
        bad.extend(chunk_bad)
    return records, bad
