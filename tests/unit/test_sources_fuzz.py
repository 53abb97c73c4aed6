"""Property tests: readers never crash, and every good line written is returned exactly once."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from guardian.core import StepRecord
from guardian.sources.console import parse_console_line
from guardian.sources.jsonl import BadLine, MetricsFile, parse_metrics_line
from guardian.sources.rollouts import group_stats
from guardian.sources.tail import LineTail, NewSegment, OversizedLine, TailItem

FUZZ = settings(max_examples=100, deadline=None)

line_bytes = st.binary(max_size=40).map(lambda b: b.replace(b"\n", b""))
huge_ints = st.integers(min_value=-(10**400), max_value=10**400)
numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(), huge_ints, st.none())
json_values = st.recursive(
    st.one_of(numbers, st.booleans(), st.text(max_size=10)),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@contextmanager
def scratch_file() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as folder:
        yield Path(folder) / "f.jsonl"


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)


def drain(tail: LineTail) -> list[TailItem]:
    items: list[TailItem] = []
    while True:
        batch = tail.poll()
        items.extend(batch.items)
        if not batch.more:
            return items


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in pairwise(points)]


@FUZZ
@given(
    lines=st.lists(line_bytes, max_size=30),
    cuts=st.lists(st.integers(min_value=0), max_size=12),
    chunk=st.integers(min_value=1, max_value=64),
    per_poll=st.integers(min_value=1, max_value=256),
    max_line=st.integers(min_value=1, max_value=48),
)
def test_tail_returns_each_complete_line_once_in_order(
    lines: list[bytes], cuts: list[int], chunk: int, per_poll: int, max_line: int
) -> None:
    data = b"".join(line + b"\n" for line in lines)
    with scratch_file() as path:
        tail = LineTail(path, chunk_bytes=chunk, max_line_bytes=max_line, max_poll_bytes=per_poll)
        got: list[TailItem] = []
        for piece in pieces(data, cuts):
            append(path, piece)
            got.extend(drain(tail))
            assert tail.buffered_bytes <= max_line
    expected: list[TailItem] = [NewSegment(0)] if data else []
    expected += [line if len(line) <= max_line else OversizedLine(0) for line in lines]
    assert got == expected


@FUZZ
@given(
    generations=st.lists(
        st.tuples(st.lists(line_bytes, max_size=8), st.lists(st.integers(min_value=0), max_size=4), st.booleans()),
        min_size=1,
        max_size=4,
    )
)
def test_tail_segments_lose_and_repeat_nothing(generations: list[tuple[list[bytes], list[int], bool]]) -> None:
    """Each generation truncates (in place, or by os.replace) and rewrites the file, polled as it grows."""
    expected: list[TailItem] = []
    got: list[TailItem] = []
    with scratch_file() as path:
        tail = LineTail(path)
        for number, (lines, cuts, replace) in enumerate(generations):
            lines = [b"generation-%d" % number, *lines]  # distinct first bytes, so a rewrite is detectable
            expected += [NewSegment(number), *lines]
            parts = pieces(b"".join(line + b"\n" for line in lines), cuts)
            if replace:
                staged = path.with_name("staged")
                staged.write_bytes(parts[0])
                os.replace(staged, path)
            else:
                with open(path, "r+b" if path.exists() else "wb") as handle:
                    handle.truncate(0)
                    handle.write(parts[0])
            got.extend(drain(tail))
            for part in parts[1:]:
                append(path, part)
                got.extend(drain(tail))
    assert got == expected


@FUZZ
@given(st.binary(max_size=200))
def test_parse_metrics_line_only_ever_raises_bad_line(line: bytes) -> None:
    try:
        record = parse_metrics_line(line)
    except BadLine as exc:
        assert exc.reason
    else:
        assert record.step >= 0


@FUZZ
@given(step=st.one_of(huge_ints, st.floats(), st.booleans(), st.none()), data=json_values)
def test_parse_metrics_line_survives_any_json(step: object, data: object) -> None:
    line = json.dumps({"step": step, "data": data}).encode()
    try:
        record = parse_metrics_line(line)
    except BadLine:
        return
    assert all(isinstance(v, float) for v in record.data.values())
    assert all(math.isfinite(v) or math.isnan(v) for v in record.data.values())


good_records = st.builds(
    StepRecord,
    step=st.integers(min_value=0, max_value=10**6),
    data=st.dictionaries(st.text(max_size=12), st.one_of(st.floats(), st.integers(), huge_ints), max_size=5),
)
garbage = st.binary(max_size=30).map(lambda b: b"#" + b.replace(b"\n", b""))


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def expected_value(value: float | int) -> float:
    try:
        number = float(value)
    except OverflowError:
        return math.nan
    return number if math.isfinite(number) else math.nan


@FUZZ
@given(
    lines=st.lists(st.one_of(good_records, garbage), max_size=20),
    cuts=st.lists(st.integers(min_value=0), max_size=10),
)
def test_metrics_file_returns_every_good_line_once_and_reports_garbage(
    lines: list[StepRecord | bytes], cuts: list[int]
) -> None:
    encoded = [
        line if isinstance(line, bytes) else json.dumps({"step": line.step, "data": line.data}).encode()
        for line in lines
    ]
    data = b"".join(line + b"\n" for line in encoded)
    with scratch_file() as path:
        source = MetricsFile(path, chunk_bytes=16)
        got: list[StepRecord] = []
        bad_numbers: list[int] = []
        for piece in pieces(data, cuts):
            append(path, piece)
            batch = source.poll()
            got += [item for item in batch.items if isinstance(item, StepRecord)]
            bad_numbers += [report.line_number for report in batch.bad_lines]
    wanted = [line for line in lines if isinstance(line, StepRecord)]
    assert [r.step for r in got] == [r.step for r in wanted]
    for record, original in zip(got, wanted, strict=True):
        assert record.data.keys() == original.data.keys()
        assert all(same(record.data[k], expected_value(v)) for k, v in original.data.items())
    assert bad_numbers == [i + 1 for i, line in enumerate(lines) if isinstance(line, bytes)]


@FUZZ
@given(st.text(max_size=200))
def test_parse_console_line_never_crashes(line: str) -> None:
    record = parse_console_line(line)
    assert record is None or record.step >= 0


@FUZZ
@given(
    step=st.integers(min_value=0, max_value=10**9),
    values=st.dictionaries(
        st.text(alphabet=st.characters(blacklist_characters="\r\n\x1b"), min_size=1, max_size=10).filter(
            lambda k: " - " not in k and k == k.strip() and not k.endswith(" -") and not k.startswith("- ")
        ),
        st.floats(),
        max_size=6,
    ),
)
def test_console_round_trip(step: int, values: dict[str, float]) -> None:
    line = f"step:{step}" + "".join(f" - {k}:np.float64({v!r})" for k, v in values.items())
    record = parse_console_line(line)
    assert record is not None and record.step == step
    assert record.data.keys() == values.keys()
    assert all(same(record.data[k], expected_value(v)) for k, v in values.items())


rollout_rows = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "uid": st.one_of(st.text(max_size=12), st.sampled_from(["g_0_0", "g_1_0", "g_1_1", "h_0_0", "h_1_0"])),
            "input": st.sampled_from(["a", "b", "c"]),
            "score": st.one_of(numbers, st.booleans(), st.text(max_size=3), st.sampled_from([0.0, 1.0])),
        },
    ),
    max_size=20,
)


@FUZZ
@given(rollout_rows)
def test_group_stats_never_crashes_and_stays_in_range(rows: list[dict[str, object]]) -> None:
    stats = group_stats(rows)
    assert stats.samples + stats.skipped_rows <= len(rows)
    assert stats.groups <= stats.samples
    parts = (stats.effective_group_ratio, stats.all_zero_fraction, stats.all_one_fraction)
    if math.isnan(stats.effective_group_ratio):
        assert all(math.isnan(p) for p in parts)
    else:
        assert all(0.0 <= p <= 1.0 for p in parts)
        assert sum(parts) <= 1.0 + 1e-12
        assert stats.mean_group_reward_std >= 0.0 or math.isnan(stats.mean_group_reward_std)
