"""Follow a growing text file line by line, by byte offset: the one place that reads metrics and stdout logs.

``LineTail.poll`` returns the complete lines appended since the last poll; a partial line waits. A new *segment*
starts when the file shrank, was replaced, or its head changed; the old file is drained first, so no line is lost.
Only regular files are read, never blocking. ``LineSplitter`` caps every line at ``max_line_bytes``.
Rules and limits: docs/decisions/0056-line-tail-segments.md."""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

from guardian.config import MAX_LINE_BYTES
from guardian.logs import event, get_logger
from guardian.regular_files import NotRegularFile, open_regular, regular_file_problem

log = get_logger("tail")

# How many leading bytes fingerprint a segment (compared on every poll to catch same-size rewrites).
HEAD_BYTES: Final = 256
# The size limits of every reader built on ``LineTail`` (the metrics JSONL, console logs), in one place.
# Bytes asked of the file system per read.
CHUNK_BYTES: Final = 1 << 20
# The most one poll reads: a replay of a large finished file goes in pieces of this size.
MAX_POLL_BYTES: Final = 4 << 20


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


class LineSplitter:
    """Cut bytes fed in pieces into lines (without their newline), never holding more than ``max_line_bytes`` of
    one: a longer line becomes one ``OversizedLine(segment)`` in its place and its bytes are skipped to its
    newline. The one capped line reader of the guardian (``LineTail``, ``capped_lines``)."""

    def __init__(self, max_line_bytes: int) -> None:
        if max_line_bytes <= 0:
            raise ValueError(f"max_line_bytes must be positive, got {max_line_bytes}")
        self.max_line = max_line_bytes
        self.segment = 0  # the segment an OversizedLine is marked with
        self.partial = bytearray()  # the unterminated last line so far
        self.skipping = False  # inside an oversized line: discard bytes until its newline

    def reset(self) -> None:
        self.partial.clear()
        self.skipping = False

    def take_partial(self) -> bytes | None:
        """The unterminated last line (the writer is done with it), or None (none, or one already too long)."""
        line = bytes(self.partial) if self.partial and not self.skipping else None
        self.reset()
        return line

    def feed(self, data: bytes, out: list[TailItem]) -> None:
        """Cut one piece into lines, continuing the partial line from the previous piece."""
        start = 0
        if self.skipping:
            newline = data.find(b"\n")
            if newline < 0:
                return
            self.skipping = False
            start = newline + 1
        if self.partial:
            newline = data.find(b"\n", start)
            if newline < 0:
                self._hold(data, start, out)
                return
            if len(self.partial) + newline - start > self.max_line:
                out.append(OversizedLine(self.segment))
            else:
                out.append(bytes(self.partial) + data[start:newline])
            self.partial.clear()
            start = newline + 1
        last = data.rfind(b"\n", start)
        if last >= 0:
            for line in data[start:last].split(b"\n"):
                out.append(OversizedLine(self.segment) if len(line) > self.max_line else line)
            start = last + 1
        self._hold(data, start, out)

    def _hold(self, data: bytes, start: int, out: list[TailItem]) -> None:
        """Buffer the start of an unterminated line (``data`` from ``start``), or give up on it if it is already
        too long (measured first: a piece of an oversized line is never copied)."""
        if len(self.partial) + len(data) - start > self.max_line:
            self.partial.clear()
            self.skipping = True
            out.append(OversizedLine(self.segment))
        elif start < len(data):
            self.partial += memoryview(data)[start:]


def capped_lines(
    handle: BinaryIO, size: int, *, max_line_bytes: int = MAX_LINE_BYTES, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[bytes | OversizedLine]:
    """The newline-terminated lines within the next ``size`` bytes of ``handle``, in order, each without its
    newline; an ``OversizedLine`` in place of each longer than ``max_line_bytes`` (never held whole). An
    unterminated last line is left out (a writer is mid-line, or bytes came after ``size`` was taken)."""
    splitter = LineSplitter(max_line_bytes)
    remaining = size
    while remaining > 0:
        data = handle.read(min(chunk_bytes, remaining))
        if not data:
            return
        remaining -= len(data)
        out: list[TailItem] = []
        splitter.feed(data, out)
        for item in out:
            if isinstance(item, bytes | OversizedLine):
                yield item


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
        self._lines = LineSplitter(max_line_bytes)  # the partial last line, capped
        self._problem: str | None = None  # why the path cannot be read now (reported once), or None
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
        return len(self._lines.partial)

    @property
    def problem(self) -> str | None:
        """Why the path names nothing readable now (``a FIFO, not a regular file``, ``a symlink loop``), or None."""
        return self._problem

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
        current = self._identity()
        if self._handle is not None and current is not None and current != self._ident:
            budget = self._drain_replaced(out, budget)
            if budget == 0:  # the old file holds more than one poll may read: finish it first
                return _batch(out, more=True)
        if self._handle is None and (self._problem is not None or not self._open(out)):
            return _batch(out)  # not there (yet), or not a file to read: reported, not raised
        assert self._handle is not None
        more = self._read_new(self._handle, budget, out)
        if final and not more:
            line = self._lines.take_partial()
            if line is not None:
                out.append(line)
        return _batch(out, more=more)

    def _identity(self) -> tuple[int, int] | None:
        """``(st_dev, st_ino)`` of the regular file (or folder) the path names now; None when it names none, or
        something that cannot be read (``problem`` says what, reported once)."""
        try:
            problem = regular_file_problem(self._path)
            st = os.stat(self._path) if problem is None else None
        except (FileNotFoundError, NotADirectoryError):  # gone between the two looks
            problem, st = None, None
        self._report(problem)
        return (st.st_dev, st.st_ino) if st is not None else None

    def _report(self, problem: str | None) -> None:
        if problem == self._problem:
            return
        if problem is not None:
            fields = {"path": self._path, "problem": problem, "then": "read on once a regular file is back"}
            log.error(event("metrics_file_unusable", fields))
        else:
            log.info(event("metrics_file_usable", {"path": self._path}))
        self._problem = problem

    def _drain_replaced(self, out: list[TailItem], budget: int) -> int:
        """Read the replaced file to its end (within ``budget`` bytes; returns what is left of it) and
        close it once done, its unterminated last line returned as a line."""
        assert self._handle is not None
        before = len(out)
        left = budget - self._read(self._handle, budget, out)
        if left == 0 and self._offset < os.fstat(self._handle.fileno()).st_size:
            self._drained += len(out) - before
            return 0
        line = self._lines.take_partial()
        if line is not None:
            out.append(line)
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
            handle = open_regular(self._path)  # kept open between polls
        except (FileNotFoundError, NotADirectoryError):
            return False
        except NotRegularFile as exc:  # replaced between the look and the open
            self._report(exc.strerror)
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
        self._lines.reset()
        self._lines.segment = segment
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
            self._lines.feed(data, out)
        return read


def _batch(items: list[TailItem], *, more: bool = False) -> TailBatch:
    oversized = sum(1 for item in items if isinstance(item, OversizedLine))
    return TailBatch(items=items, oversized_lines=oversized, more=more)
