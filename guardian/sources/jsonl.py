"""Read verl's ``file`` logger: one ``{"step":N,"data":{...}}`` object per line (facts §2).

verl writes compact orjson with NaN/±inf as ``null``; the calibration traces write the bare tokens
``NaN``/``Infinity`` instead, so a line orjson rejects is retried with the stdlib parser, which accepts
them. Only numbers are kept (as floats); a non-finite value, however written, becomes ``math.nan``.
A line that cannot be read is reported with its file, segment and line number and skipped: one bad
line never costs the good lines around it.

Damage is contained to the smallest piece that carries it. A key that is not valid UTF-8 (or not
valid Unicode: a lone ``\\udXXX`` escape) is dropped with its value and reported; the step keeps its
other metrics. A step with more than ``MAX_KEYS_PER_STEP`` keys keeps every key the guardian reads
(``keys.CHECKED_KEYS`` and ``keys.CHECKED_PREFIXES``) plus the first ``MAX_KEYS_PER_STEP`` others,
and the first capped step of a file is reported with the count dropped (verl logs ~150-300 keys; a
logger gone wrong may log one per sample). A line longer than ``MAX_LINE_BYTES`` is never held in
memory whole (guardian/sources/tail.py skips it) and is reported as a bad line.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from guardian.history import StepRecord
from guardian.keys import CHECKED_KEYS, CHECKED_PREFIXES
from guardian.logs import event, get_logger
from guardian.sources.tail import LineTail, NewSegment, OversizedLine

log = get_logger("jsonl")

# Keys kept per step besides the ones the guardian reads (verl logs ~150-300).
MAX_KEYS_PER_STEP: Final = 5_000
# The longest line read: 5,000 keys of ~100 bytes each with room to spare (verl's are ~15 kB). Parsing
# a line takes ~10x its length in memory, so this bounds a parse at a few tens of MB.
MAX_LINE_BYTES: Final = 4 << 20

__all__ = [
    "MAX_KEYS_PER_STEP",
    "MAX_LINE_BYTES",
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
    """Parse one ``file`` logger line; raise ``BadLine`` if it is not a metrics record (``parse_line``
    without the account of what was left out)."""
    return parse_line(line, keys).record


def parse_line(line: bytes, keys: frozenset[str] | None = None, max_keys: int = MAX_KEYS_PER_STEP) -> ParsedLine:
    """Parse one ``file`` logger line; raise ``BadLine`` if it is not a metrics record.

    ``keys`` keeps only those metrics, and those under ``keys.CHECKED_PREFIXES`` (a replay needs the ~60
    keys the checks read, not all 300). Keys that are not valid Unicode are left out, and so are the
    keys beyond ``max_keys`` that the guardian does not read (see the module docstring).
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
    if keys is None and len(raw) > max_keys:
        raw, capped = _capped(raw, max_keys)
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
    return ParsedLine(StepRecord(step=step, data=data), invalid_keys=invalid, capped_keys=capped)


def _capped(raw: dict[str, Any], max_keys: int) -> tuple[dict[str, Any], int]:
    """Every key the guardian reads plus the first ``max_keys`` others; and how many were dropped."""
    kept: dict[str, Any] = {}
    others = 0
    for key, value in raw.items():
        if key in CHECKED_KEYS or key.startswith(CHECKED_PREFIXES):
            kept[key] = value
        elif others < max_keys:
            kept[key] = value
            others += 1
    return kept, len(raw) - len(kept)


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
    before its records; line numbers in reports restart at 1 with each segment. Keys left out of a
    record are logged (``event=metrics_keys_dropped``: every line with invalid keys, the first capped
    line only) and counted in ``invalid_keys_dropped`` / ``capped_keys_dropped``.
    """

    def __init__(
        self,
        path: Path,
        *,
        chunk_bytes: int = 1 << 20,
        max_line_bytes: int = MAX_LINE_BYTES,
        max_poll_bytes: int = 4 << 20,
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
