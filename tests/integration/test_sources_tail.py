"""LineTail on real files: growth, partial lines, truncation, replacement, oversized lines, memory."""

from __future__ import annotations

import gc
import logging
import os
import tracemalloc
import warnings
from pathlib import Path

import pytest

from guardian.sources.tail import LineTail, NewSegment, OversizedLine, TailBatch, TailItem


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)


def rewrite(path: Path, data: bytes) -> None:
    """Truncate in place and write again (same inode), like verl's open(path, "wb")."""
    with open(path, "r+b" if path.exists() else "wb") as handle:
        handle.truncate(0)
        handle.write(data)


def lines_of(batch: TailBatch) -> list[bytes]:
    return [item for item in batch.items if isinstance(item, bytes)]


def drain(tail: LineTail) -> list[TailItem]:
    items: list[TailItem] = []
    while True:
        batch = tail.poll()
        items.extend(batch.items)
        if not batch.more:
            return items


def test_missing_file_is_empty_then_first_content_gets_segment_zero(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    tail = LineTail(path)
    assert tail.poll() == TailBatch(items=[])
    path.touch()
    assert tail.poll().items == []  # an empty file has no content yet: no segment
    append(path, b"a\nb\n")
    assert tail.poll().items == [NewSegment(0), b"a", b"b"]
    assert tail.poll().items == []
    assert (tail.path, tail.segment, tail.offset) == (path, 0, 4)


def test_partial_line_completed_across_polls(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    tail = LineTail(path)
    append(path, b'{"step":1}\n{"st')
    assert tail.poll().items == [NewSegment(0), b'{"step":1}']
    assert tail.buffered_bytes == 4
    append(path, b'ep":2')
    assert tail.poll().items == []
    append(path, b"}\n")
    assert tail.poll().items == [b'{"step":2}']
    assert tail.buffered_bytes == 0


def test_final_poll_returns_unterminated_last_line(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b"one\ntwo")
    tail = LineTail(path)
    assert tail.poll().items == [NewSegment(0), b"one"]
    assert tail.poll(final=True).items == [b"two"]
    assert tail.poll(final=True).items == []


def test_lines_split_across_tiny_chunks(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    lines = [b"x" * n for n in range(0, 40, 3)]
    path.write_bytes(b"\n".join(lines) + b"\n")
    tail = LineTail(path, chunk_bytes=7)
    assert tail.poll().items == [NewSegment(0), *lines]


def test_truncated_shorter_starts_new_segment(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    tail = LineTail(path)
    path.write_bytes(b"old-1\nold-2\nold-3\npart")
    assert lines_of(tail.poll()) == [b"old-1", b"old-2", b"old-3"]
    rewrite(path, b"new-1\n")
    assert tail.poll().items == [NewSegment(1), b"new-1"]  # the old partial line is dropped
    append(path, b"new-2\n")
    assert tail.poll().items == [b"new-2"]
    assert tail.segment == 1


def test_truncated_to_empty_is_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    tail = LineTail(path)
    path.write_bytes(b"a\n")
    tail.poll()
    rewrite(path, b"")
    assert tail.poll().items == [NewSegment(1)]
    append(path, b"b\n")
    assert tail.poll().items == [b"b"]


@pytest.mark.parametrize("extra", [b"", b"more-lines\n" * 3], ids=["same-size", "larger"])
def test_rewrite_to_same_or_larger_size_is_a_new_segment(tmp_path: Path, extra: bytes) -> None:
    path = tmp_path / "m.jsonl"
    tail = LineTail(path)
    path.write_bytes(b'{"step":7}\n{"step":8}\n')
    assert lines_of(tail.poll()) == [b'{"step":7}', b'{"step":8}']
    rewrite(path, b'{"step":3}\n{"step":4}\n' + extra)
    batch = tail.poll()
    assert batch.items[0] == NewSegment(1)
    assert lines_of(batch) == [b'{"step":3}', b'{"step":4}', *extra.splitlines()]
    assert tail.poll().items == []


def test_replaced_file_is_a_new_segment(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    tail = LineTail(path)
    path.write_bytes(b"first\n")
    tail.poll()
    staged = tmp_path / "staged"
    staged.write_bytes(b"first\nsecond\n")  # same head and larger: only the inode tells
    os.replace(staged, path)
    assert tail.poll().items == [NewSegment(1), b"first", b"second"]


def test_deleted_file_keeps_state_and_recreation_is_a_new_segment(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    tail = LineTail(path)
    path.write_bytes(b"a\n")
    tail.poll()
    keep = tmp_path / "keep"  # hold the inode so the new file cannot reuse it
    os.link(path, keep)
    path.unlink()
    assert tail.poll().items == []
    path.write_bytes(b"a\nb\n")
    assert tail.poll().items == [NewSegment(1), b"a", b"b"]


def test_a_file_renamed_over_is_read_to_its_end_first(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The writer logs 3 more steps, then the file is replaced before the guardian polls: every line of
    both files arrives exactly once, the old file's in order before the new segment."""
    path = tmp_path / "m.jsonl"
    tail = LineTail(path)
    path.write_bytes(b"1\n2\n")
    assert tail.poll().items == [NewSegment(0), b"1", b"2"]
    append(path, b"3\n4\n5\n")  # unread when the file is replaced
    staged = tmp_path / "staged"
    staged.write_bytes(b"1\n2\n")
    os.replace(staged, path)
    with caplog.at_level(logging.INFO, logger="guardian"):
        assert tail.poll().items == [b"3", b"4", b"5", NewSegment(1), b"1", b"2"]
    assert [r.getMessage() for r in caplog.records if "metrics_file_replaced" in r.getMessage()] == [
        f"event=metrics_file_replaced path={path} segment=0 drained_lines=3"
    ]
    append(path, b"3\n")
    assert tail.poll().items == [b"3"]  # the new file is followed from where it was read


def test_a_replaced_file_s_unterminated_last_line_is_a_line(tmp_path: Path) -> None:
    """A file renamed away grows no more: its last line is as complete as it will ever be."""
    path = tmp_path / "m.jsonl"
    tail = LineTail(path)
    path.write_bytes(b"a\nb")
    assert tail.poll().items == [NewSegment(0), b"a"]
    os.rename(path, tmp_path / "m.jsonl.1")  # rotated away
    path.write_bytes(b"c\n")
    assert tail.poll().items == [b"b", NewSegment(1), b"c"]
    assert tail.buffered_bytes == 0


def test_draining_a_replaced_file_respects_the_poll_budget(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    tail = LineTail(path, chunk_bytes=64, max_poll_bytes=100)
    path.write_bytes(b"start\n")
    tail.poll()
    old = [f"old-{i:03d}".encode() for i in range(50)]  # 400 bytes: four polls' worth
    append(path, b"\n".join(old) + b"\n")
    staged = tmp_path / "staged"
    staged.write_bytes(b"new\n")
    os.replace(staged, path)
    items = drain(tail)
    assert items == [*old, NewSegment(1), b"new"]


def test_a_deleted_file_is_still_followed_while_its_writer_appends(tmp_path: Path) -> None:
    path = tmp_path / "m.log"
    tail = LineTail(path)
    with open(path, "wb", buffering=0) as writer:
        writer.write(b"a\n")
        assert tail.poll().items == [NewSegment(0), b"a"]
        path.unlink()
        writer.write(b"b\n")  # the writer still holds the file
        assert tail.poll().items == [b"b"]
        writer.write(b"c\n")
        path.write_bytes(b"x\n")  # a new file appears: the old one is finished first
        assert tail.poll().items == [b"c", NewSegment(1), b"x"]


def test_close_releases_the_file_and_a_dropped_tail_closes_it_too(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b"a\n")
    tail = LineTail(path)
    tail.poll()
    tail.close()
    tail.close()  # idempotent
    append(path, b"b\n")
    assert tail.poll().items == [b"b"]  # reopened: the same file, the same segment
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del tail
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []


def test_oversized_lines_are_dropped_counted_and_bounded(tmp_path: Path) -> None:
    path = tmp_path / "m.log"
    tail = LineTail(path, chunk_bytes=8, max_line_bytes=10)
    append(path, b"ok\n" + b"y" * 25 + b"\nfine\n")  # oversized line complete within the poll
    batch = tail.poll()
    assert batch.items == [NewSegment(0), b"ok", OversizedLine(0), b"fine"]
    assert batch.oversized_lines == 1
    append(path, b"z" * 30)  # oversized and unterminated: given up on, not buffered
    batch = tail.poll()
    assert batch.oversized_lines == 1
    assert tail.buffered_bytes <= 10
    append(path, b"z" * 30 + b"\nafter\n")
    assert tail.poll() == TailBatch(items=[b"after"])
    append(path, b"x" * 10 + b"\n")  # exactly at the limit is kept
    assert tail.poll().items == [b"x" * 10]


def test_max_poll_bytes_splits_a_large_backlog(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    lines = [f"line-{i:05d}".encode() for i in range(1000)]
    path.write_bytes(b"\n".join(lines) + b"\n")
    tail = LineTail(path, chunk_bytes=100, max_poll_bytes=1000)
    first = tail.poll()
    assert first.more
    assert tail.offset == 1000
    rest = drain(tail)
    got = [item for item in [*first.items, *rest] if isinstance(item, bytes)]
    assert got == lines


def test_invalid_sizes_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        LineTail(tmp_path / "m", chunk_bytes=0)


def test_fifty_megabytes_stream_with_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    line = b'{"step":1,"data":{"k":' + b"1" * 4000 + b"}}\n"
    count = (50 << 20) // len(line)
    block = line * 256
    with open(path, "wb") as handle:
        for _ in range(count // 256):
            handle.write(block)
        handle.write(line * (count % 256))
    chunk = 1 << 20
    tail = LineTail(path, chunk_bytes=chunk, max_line_bytes=64 << 10, max_poll_bytes=2 * chunk)
    tracemalloc.start()
    try:
        seen = 0
        while True:
            batch = tail.poll()
            seen += sum(1 for item in batch.items if isinstance(item, bytes))
            assert tail.buffered_bytes <= len(line)
            del batch
            if seen == count:
                break
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seen == count
    assert tail.offset == path.stat().st_size
    # one poll's lines (2 chunks) + the chunk being split + one partial line, with slack
    assert peak < 6 * chunk, f"peak {peak} bytes"
