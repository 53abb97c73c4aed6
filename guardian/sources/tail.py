"""Follow a growing text file line by line, by byte offset.

verl's ``file`` logger appends one line per step to a file that it truncates on every (re)start
(facts §2); stdout logs grow the same way and may be rotated (replaced). ``LineTail`` is the one place
that touches the file system for these: each ``poll`` reads only the bytes appended since the last
poll, in bounded chunks, and returns the complete lines. A partial last line (the writer is mid-line)
waits in a small buffer until its newline arrives.

A *segment* is one uninterrupted life of the file. A new segment starts when the file

- shrank below the offset already read (truncated, e.g. verl restarted),
- was replaced (``st_dev``/``st_ino`` changed, e.g. ``os.replace`` or delete-and-recreate), or
- was truncated and rewritten to at least the old size between two polls (its first bytes, up to
  ``HEAD_BYTES``, no longer match what was read before).

The file being read stays open between polls, so no line is lost to a replacement: when the path
names another file, the old one is read to its end first (a file renamed away or deleted grows no
more, so its unterminated last line counts as a line), and ``event=metrics_file_replaced`` reports
how many lines that drain returned. While the path names no file, the open one is still followed (the
writer may still hold it). Call ``close`` when done (a dropped ``LineTail`` closes its file too).

A rewrite whose first ``HEAD_BYTES`` bytes equal the old ones and that is at least as long is not
detectable from the outside; that is the limit of this design.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

from guardian.logs import event, get_logger

log = get_logger("tail")

# How many leading bytes fingerprint a segment (compared on every poll to catch same-size rewrites).
HEAD_BYTES: Final = 256
# The size limits of every reader built on ``LineTail`` (the metrics JSONL, console logs), in one place.
# Bytes asked of the file system per read.
CHUNK_BYTES: Final = 1 << 20
# The most one poll reads: a replay of a large finished file goes in pieces of this size.
MAX_POLL_BYTES: Final = 4 << 20
# The longest line kept: a metrics line of 5,000 keys of ~100 bytes each with room to spare (verl's are
# ~15 kB). Parsing a JSON line takes ~10x its length in memory, so this bounds a parse at a few tens of MB.
MAX_LINE_BYTES: Final = 4 << 20


@dataclass(frozen=True, slots=True)
class NewSegment:
    """Marker: the lines after it belong to segment ``segment`` (0 for the first content seen)."""

    segment: int


@dataclass(frozen=True, slots=True)
class OversizedLine:
    """Placeholder, in line order, for a line longer than ``max_line_bytes`` that was dropped.

    It keeps line numbering exact for the readers that report bad lines by number.
    """

    segment: int


TailItem = bytes | NewSegment | OversizedLine


@dataclass(frozen=True, slots=True)
class TailBatch:
    """What one poll found, in file order.

    ``items`` holds complete lines (without the newline), a ``NewSegment`` before the lines of each
    segment (the first segment included), and an ``OversizedLine`` where a line was dropped.
    ``oversized_lines`` counts those placeholders. ``more`` is True when the file held more bytes than
    this poll was allowed to read: poll again (a replay of a large finished file).
    """

    items: list[TailItem]
    oversized_lines: int = 0
    more: bool = False


class LineTail:
    """Stream complete lines from ``path`` as it grows; see the module docstring for segments.

    Memory is bounded: the file is read ``chunk_bytes`` at a time, at most ``max_poll_bytes`` per
    poll, and a partial line is kept only up to ``max_line_bytes`` (longer lines are skipped to their
    newline and reported as ``OversizedLine``).
    """

    def __init__(
        self,
        path: Path,
        *,
        chunk_bytes: int = CHUNK_BYTES,
        max_line_bytes: int = MAX_LINE_BYTES,
        max_poll_bytes: int = MAX_POLL_BYTES,
    ) -> None:
        if chunk_bytes <= 0 or max_line_bytes <= 0 or max_poll_bytes <= 0:
            raise ValueError(
                f"LineTail({path}): chunk_bytes, max_line_bytes and max_poll_bytes must be positive, got "
                f"{chunk_bytes}, {max_line_bytes}, {max_poll_bytes}"
            )
        self._path = Path(path)
        self._chunk = chunk_bytes
        self._max_line = max_line_bytes
        self._max_poll = max_poll_bytes
        self._started = False  # True once the first byte of content was seen
        self._segment = 0
        self._offset = 0  # bytes of the current segment consumed (the partial buffer included)
        self._ident: tuple[int, int] | None = None  # (st_dev, st_ino) of the file being read
        self._head = b""  # the file's first min(HEAD_BYTES, offset) bytes, as read
        self._partial = bytearray()  # the unterminated last line so far
        self._skipping = False  # inside an oversized line: discard bytes until its newline
        self._handle: BinaryIO | None = None  # the file being read, open between polls
        self._closer: weakref.finalize[[], LineTail] | None = None  # closes it when this tail is dropped unclosed
        self._drained = 0  # lines read from a replaced file since it was found replaced

    @property
    def path(self) -> Path:
        return self._path

    @property
    def segment(self) -> int:
        """The current segment number (0 until a second segment is seen)."""
        return self._segment

    @property
    def offset(self) -> int:
        """Bytes of the current segment read so far (including a buffered partial line)."""
        return self._offset

    @property
    def buffered_bytes(self) -> int:
        """Size of the partial line held in memory (never more than ``max_line_bytes``)."""
        return len(self._partial)

    def close(self) -> None:
        """Close the file being read; a later ``poll`` opens the path again (as a new segment if it is
        another file by then)."""
        if self._closer is not None:
            self._closer()
        self._handle = self._closer = None

    def poll(self, *, final: bool = False) -> TailBatch:
        """Read what was appended since the last poll and return the complete lines.

        ``final=True`` means the writer is done: once the file is read to its end, a partial last line
        (no trailing newline) is returned as a line too. A missing file gives an empty batch.
        """
        out: list[TailItem] = []
        budget = self._max_poll
        current = _identity(self._path)
        if self._handle is not None and current is not None and current != self._ident:
            budget = self._drain_replaced(out, budget)
            if budget == 0:  # the old file holds more than one poll may read: finish it first
                return _batch(out, more=True)
        if self._handle is None and not self._open(out):
            return _batch(out)  # not there (yet): not an error
        assert self._handle is not None
        more = self._read_new(self._handle, budget, out)
        if final and not more and self._partial and not self._skipping:
            out.append(bytes(self._partial))
            self._partial.clear()
        return _batch(out, more=more)

    def _drain_replaced(self, out: list[TailItem], budget: int) -> int:
        """Read the replaced file to its end (within ``budget`` bytes; returns what is left of it) and
        close it once done, its unterminated last line returned as a line."""
        assert self._handle is not None
        before = len(out)
        left = budget - self._read(self._handle, budget, out)
        if left == 0 and self._offset < os.fstat(self._handle.fileno()).st_size:
            self._drained += len(out) - before
            return 0
        if self._partial and not self._skipping:
            out.append(bytes(self._partial))
        self._partial.clear()
        self._skipping = False
        self._drained += len(out) - before
        log.info(
            event(
                "metrics_file_replaced", {"path": self._path, "segment": self._segment, "drained_lines": self._drained}
            )
        )
        self._drained = 0
        self.close()
        return left

    def _open(self, out: list[TailItem]) -> bool:
        """Open the path (a new segment if it is not the file read before); False if there is none."""
        try:
            handle: BinaryIO = open(self._path, "rb", buffering=0)  # noqa: SIM115 - kept open between polls
        except (FileNotFoundError, NotADirectoryError):
            return False
        self._handle = handle
        self._closer = weakref.finalize(self, handle.close)
        st = os.fstat(handle.fileno())
        ident = (st.st_dev, st.st_ino)
        if self._started and ident != self._ident:
            self._start_segment(self._segment + 1, out)
        self._ident = ident
        return True

    def _read_new(self, handle: BinaryIO, budget: int, out: list[TailItem]) -> bool:
        """Segment bookkeeping, then read at most ``budget`` bytes; True if bytes were left unread."""
        size = os.fstat(handle.fileno()).st_size
        if self._started and self._rewritten(handle, size):
            self._start_segment(self._segment + 1, out)
        if not self._started:
            if size == 0:
                return False
            self._start_segment(0, out)
        self._read(handle, budget, out)
        return self._offset < size

    def _rewritten(self, handle: BinaryIO, size: int) -> bool:
        """Whether the open file was truncated (or truncated and rewritten) under the offset read."""
        if size < self._offset:
            return True
        if not self._head:
            return False
        handle.seek(0)
        return handle.read(len(self._head)) != self._head

    def _start_segment(self, segment: int, out: list[TailItem]) -> None:
        self._started = True
        self._segment = segment
        self._offset = 0
        self._head = b""
        self._partial.clear()
        self._skipping = False
        out.append(NewSegment(segment))

    def _read(self, handle: BinaryIO, budget: int, out: list[TailItem]) -> int:
        """Read from the offset to the end of the file, at most ``budget`` bytes; returns the bytes read."""
        handle.seek(self._offset)
        read = 0
        while read < budget:
            data = handle.read(min(self._chunk, budget - read))
            if not data:
                break
            if len(self._head) < HEAD_BYTES:
                self._head += data[: HEAD_BYTES - len(self._head)]
            self._offset += len(data)
            read += len(data)
            self._split(data, out)
        return read

    def _split(self, data: bytes, out: list[TailItem]) -> None:
        """Cut one chunk into lines, continuing the partial line from the previous chunk."""
        start = 0
        if self._skipping:
            newline = data.find(b"\n")
            if newline < 0:
                return
            self._skipping = False
            start = newline + 1
        if self._partial:
            newline = data.find(b"\n", start)
            if newline < 0:
                self._hold(data[start:], out)
                return
            self._emit(bytes(self._partial) + data[start:newline], out)
            self._partial.clear()
            start = newline + 1
        last = data.rfind(b"\n", start)
        if last >= 0:
            for line in data[start:last].split(b"\n"):
                self._emit(line, out)
            start = last + 1
        self._hold(data[start:], out)

    def _emit(self, line: bytes, out: list[TailItem]) -> None:
        if len(line) > self._max_line:
            out.append(OversizedLine(self._segment))
        else:
            out.append(line)

    def _hold(self, piece: bytes, out: list[TailItem]) -> None:
        """Buffer the start of an unterminated line, or give up on it if it is already too long."""
        if len(self._partial) + len(piece) > self._max_line:
            self._partial.clear()
            self._skipping = True
            out.append(OversizedLine(self._segment))
        else:
            self._partial += piece


def _identity(path: Path) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of the file ``path`` names now, or None if it names none."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_dev, st.st_ino)


def _batch(items: list[TailItem], *, more: bool = False) -> TailBatch:
    oversized = sum(1 for item in items if isinstance(item, OversizedLine))
    return TailBatch(items=items, oversized_lines=oversized, more=more)
