"""Read verl's ``file`` logger: one ``{"step":N,"data":{...}}`` object per line (facts §2).

Keeps numbers only, as floats; any non-finite value becomes ``math.nan``. Damage stays in the smallest piece:
a bad line or key is reported and skipped, never the lines around it. A step is capped at
``len(CHECKED_KEYS) + MAX_KEYS_PER_STEP`` keys, keeping every checked key (docs/decisions/0057-jsonl-key-cap.md)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from guardian.config import MAX_KEYS_PER_STEP, MAX_LINE_BYTES
from guardian.core import MAX_STEP, StepRecord, valid_step
from guardian.keys import CHECKED_KEYS, CHECKED_PREFIXES
from guardian.logs import event, get_logger
from guardian.sources.tail import CHUNK_BYTES, MAX_POLL_BYTES, LineTail, NewSegment, OversizedLine

log = get_logger("jsonl")

__all__ = [
    "BadLine",
    "BadLineReport",
    "MetricsBatch",
    "MetricsFile",
    "NewSegment",  # re-exported: consumers of MetricsBatch.items need it
    "ParsedLine",
    "iter_records",
    "metric_value",
    "parse_line",
    "parse_metrics_line",
    "read_all",
    "read_in_pieces",
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


@dataclass(frozen=True, slots=True)
class ParsedLine:
    """A line's record and what was left out of it: ``invalid_keys`` keys that were not valid UTF-8,
    ``capped_keys`` keys beyond ``max_keys``."""

    record: StepRecord
    invalid_keys: int = 0
    capped_keys: int = 0


def _loads(line: bytes) -> tuple[object, bool]:
    """The parsed line, and whether its keys need a Unicode check (it was not valid Unicode as is)."""
    try:
        return orjson.loads(line), False
    except orjson.JSONDecodeError:
        pass
    # invalid UTF-8 bytes become lone surrogates, so one bad key cannot cost the whole line
    text = line.decode("utf-8", errors="surrogateescape")
    try:  # the stdlib parser accepts NaN / Infinity / -Infinity and integers of any size
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BadLine(f"not JSON ({exc}): {_excerpt(line)}") from None
    return obj, not text.isascii() or b"\\u" in line


def _is_unicode(key: str) -> bool:
    """Whether ``key`` is valid Unicode (no lone surrogate from a bad byte or a ``\\udXXX`` escape)."""
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _step(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        step = value
    elif isinstance(value, float) and value.is_integer():
        step = int(value)
    else:
        raise BadLine(f"'step' must be an integer, got {_excerpt(value)}")
    if not valid_step(step):
        raise BadLine(f"'step' must be between 0 and {MAX_STEP}, got {_excerpt(step)}")
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
    """Parse one ``file`` logger line; raise ``BadLine`` if it is not a metrics record (``parse_line``
    without the account of what was left out)."""
    return parse_line(line, keys).record


def parse_line(line: bytes, keys: frozenset[str] | None = None, max_keys: int = MAX_KEYS_PER_STEP) -> ParsedLine:
    """Parse one ``file`` logger line; raise ``BadLine`` if it is not a metrics record.

    ``keys`` keeps only those metrics, and those under ``keys.CHECKED_PREFIXES`` (a replay needs the ~60
    keys the checks read, not all 300). Keys that are not valid Unicode are left out, and so are the
    keys beyond the ``max_keys`` cap (see the module docstring).
    """
    obj, check_unicode = _loads(line)
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
    invalid = 0
    if check_unicode:
        valid = {k: v for k, v in raw.items() if _is_unicode(k)}
        invalid = len(raw) - len(valid)
        raw = valid
    capped = 0
    pairs: Iterable[tuple[str, Any]]
    if keys is not None:
        pairs, capped = _kept(raw, keys, max_keys, prefixed=_PREFIX_BYTES.search(line) is not None)
    elif len(raw) > max_keys:
        pairs, capped = _capped(raw, max_keys)
    else:
        pairs = raw.items()
    data: dict[str, float] = {}
    for key, value in pairs:
        kind = type(value)
        if kind is float:  # the common case first: no call per value on 300-key lines
            data[key] = value if value - value == 0.0 else math.nan
            continue
        number = metric_value(value)
        if number is not None:
            data[key] = number
    return ParsedLine(StepRecord(step=step, data=data), invalid_keys=invalid, capped_keys=capped)


def _capped(raw: dict[str, Any], max_keys: int) -> tuple[list[tuple[str, Any]], int]:
    """The pairs of ``raw`` kept under the cap (the module docstring says which), in file order; and how
    many were dropped."""
    prefixed = sum(1 for key in raw if key.startswith(CHECKED_PREFIXES) and key not in CHECKED_KEYS)
    prefixed_room = min(prefixed, max_keys)
    others_room = max_keys - prefixed_room
    kept: list[tuple[str, Any]] = []
    for key, value in raw.items():
        if key in CHECKED_KEYS:
            kept.append((key, value))
        elif key.startswith(CHECKED_PREFIXES):
            if prefixed_room:
                kept.append((key, value))
                prefixed_room -= 1
        elif others_room:
            kept.append((key, value))
            others_room -= 1
    return kept, len(raw) - len(kept)


# a line holds a prefixed key only if its bytes do: one search instead of a test per key of 300-key lines
_PREFIX_BYTES = re.compile(b"|".join(re.escape(p.encode()) for p in CHECKED_PREFIXES))


def _kept(
    raw: dict[str, Any], keys: frozenset[str], max_keys: int, *, prefixed: bool
) -> tuple[list[tuple[str, Any]], int]:
    """The pairs of ``raw`` whose key is in ``keys`` and (``prefixed``) the first ``max_keys`` others
    that start with one of ``CHECKED_PREFIXES``; and how many of those were dropped."""
    kept = [(k, raw[k]) for k in keys if k in raw]
    if not prefixed:
        return kept, 0
    under = [(k, v) for k, v in raw.items() if k.startswith(CHECKED_PREFIXES) and k not in keys]
    kept.extend(under[:max_keys])
    return kept, max(0, len(under) - max_keys)


class MetricsFile:
    """Tail a ``file`` logger JSONL as it grows; each poll returns the new records.

    A new segment (the file was truncated or replaced: verl restarted) is marked with ``NewSegment``
    before its records; line numbers in reports restart at 1 with each segment. Keys left out of a
    record are logged (``event=metrics_keys_dropped``: every line with invalid keys, the first capped
    line only) and counted in ``invalid_keys_dropped`` / ``capped_keys_dropped``.
    """

    def __init__(
        self,
        path: Path,
        *,
        chunk_bytes: int = CHUNK_BYTES,
        max_line_bytes: int = MAX_LINE_BYTES,
        max_poll_bytes: int = MAX_POLL_BYTES,
        keys: frozenset[str] | None = None,
        max_keys: int = MAX_KEYS_PER_STEP,
    ) -> None:
        self._keys = keys
        self._max_keys = max_keys
        self.invalid_keys_dropped = 0
        self.capped_keys_dropped = 0
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

    def close(self) -> None:
        """Close the file being tailed (see ``LineTail.close``)."""
        self._tail.close()

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
        parsed = parse_line(item, self._keys, self._max_keys)
        if parsed.invalid_keys:
            self.invalid_keys_dropped += parsed.invalid_keys
            self._report_dropped(parsed, "invalid_utf8", parsed.invalid_keys)
        if parsed.capped_keys:
            if not self.capped_keys_dropped:  # once per file: a logger gone wrong does it on every line
                self._report_dropped(parsed, f"over_{self._max_keys}_keys", parsed.capped_keys)
            self.capped_keys_dropped += parsed.capped_keys
        return parsed.record

    def _report_dropped(self, parsed: ParsedLine, reason: str, count: int) -> None:
        fields = {
            "path": self.path,
            "segment": self._segment,
            "line": self._line_number,
            "step": parsed.record.step,
            "reason": reason,
            "dropped": count,
            "kept": len(parsed.record.data),
        }
        log.warning(event("metrics_keys_dropped", fields))


Pieces = Iterator[tuple[list[StepRecord], list[BadLineReport]]]


def read_in_pieces(source: MetricsFile, what: str) -> Pieces:
    """Read a finished file to its end in bounded pieces (one poll each: its records and bad lines), then
    close it; ``what`` names the file in the error if it does not exist. The one loop behind
    ``iter_records`` and ``console.iter_console_records``."""
    if not source.path.is_file():
        raise FileNotFoundError(f"{what} {source.path} does not exist")
    try:
        while True:
            batch = source.poll(final=True)
            yield [item for item in batch.items if isinstance(item, StepRecord)], batch.bad_lines
            if not batch.more:
                return
    finally:
        source.close()


def iter_records(
    path: Path,
    *,
    max_poll_bytes: int = MAX_POLL_BYTES,
    max_line_bytes: int = MAX_LINE_BYTES,
    max_keys: int = MAX_KEYS_PER_STEP,
    keys: frozenset[str] | None = None,
) -> Pieces:
    """Replay a finished file in bounded pieces: each yield is one poll's records and bad lines. The
    limits are ``MetricsFile``'s; a replay passes the configured ones so it reads a file as the live
    guardian does."""
    source = MetricsFile(
        Path(path), max_poll_bytes=max_poll_bytes, max_line_bytes=max_line_bytes, max_keys=max_keys, keys=keys
    )
    return read_in_pieces(source, "metrics file")


def read_all(path: Path, *, max_poll_bytes: int = MAX_POLL_BYTES) -> tuple[list[StepRecord], list[BadLineReport]]:
    """Every record of a finished file, and its bad lines (the file is streamed, never slurped)."""
    records: list[StepRecord] = []
    bad: list[BadLineReport] = []
    for chunk_records, chunk_bad in iter_records(path, max_poll_bytes=max_poll_bytes):
        records.extend(chunk_records)
        bad.extend(chunk_bad)
    return records, bad
