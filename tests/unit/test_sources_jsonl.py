"""verl ``file`` logger lines: parsing, bad-line reports, tailing, and the real run's files."""

from __future__ import annotations

import math
import tracemalloc
from pathlib import Path

import orjson
import pytest
from conftest import FIXTURES

from guardian.core import StepRecord
from guardian.sources.jsonl import (
    MAX_LINE_BYTES,
    BadLine,
    BadLineReport,
    MetricsBatch,
    MetricsFile,
    iter_records,
    parse_line,
    parse_metrics_line,
    read_all,
)
from guardian.sources.tail import NewSegment

RUN = FIXTURES / "verl-0.9.1-run"
TRACES = FIXTURES / "traces"


def records(batch: MetricsBatch) -> list[StepRecord]:
    return [item for item in batch.items if isinstance(item, StepRecord)]


def test_parses_verl_line_keeping_numbers_only() -> None:
    line = (
        b'{"step":1,"data":{"actor/pg_loss":0.0123,"num_turns/max":4,"x/nan":null,'
        b'"flag":true,"name":"gsm8k","list":[1],"obj":{"a":1}}}'
    )
    record = parse_metrics_line(line)
    assert record.step == 1
    assert set(record.data) == {"actor/pg_loss", "num_turns/max", "x/nan"}
    assert record.data["actor/pg_loss"] == 0.0123
    assert record.data["num_turns/max"] == 4.0 and isinstance(record.data["num_turns/max"], float)
    assert math.isnan(record.data["x/nan"])


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "null", "1e400", "-1e400"])
def test_non_finite_tokens_become_nan(token: str) -> None:
    record = parse_metrics_line(f'{{"step": 3, "data": {{"a": {token}, "b": 1.5}}}}'.encode())
    assert math.isnan(record.data["a"])
    assert record.data["b"] == 1.5


def test_huge_integers_do_not_crash() -> None:
    record = parse_metrics_line(b'{"step":1,"data":{"big":' + b"9" * 400 + b',"u64":18446744073709551616}}')
    assert math.isnan(record.data["big"])
    assert record.data["u64"] == pytest.approx(1.8446744073709552e19)


def test_integral_float_step_is_accepted() -> None:
    assert parse_metrics_line(b'{"step":3.0,"data":{}}') == StepRecord(step=3, data={})


OUT_OF_RANGE = "'step' must be between 0 and 9223372036854775807, got "


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"step":1,"data":', "not JSON"),
        (b"\xff\xfe garbage", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"data":{}}', "no 'step' field"),
        (b'{"step":"3","data":{}}', "'step' must be an integer, got '3'"),
        (b'{"step":true,"data":{}}', "'step' must be an integer, got True"),
        (b'{"step":3.5,"data":{}}', "'step' must be an integer, got 3.5"),
        (b'{"step":NaN,"data":{}}', "'step' must be an integer, got nan"),
        (b'{"step":null,"data":{}}', "'step' must be an integer, got None"),
        (b'{"step":-1,"data":{}}', f"{OUT_OF_RANGE}-1"),
        (b'{"step":9223372036854775808,"data":{}}', f"{OUT_OF_RANGE}9223372036854775808"),
        (b'{"step":1e300,"data":{}}', f"{OUT_OF_RANGE}100000000000000005250476025520442024870446858110815915491..."),
        (b'{"step":1}', "no 'data' field"),
        (b'{"step":1,"data":[1]}', "'data' must be an object, got [1]"),
        (b'{"step":1,"data":null}', "'data' must be an object, got None"),
    ],
)
def test_bad_lines_raise_with_a_clear_reason(line: bytes, reason: str) -> None:
    with pytest.raises(BadLine, match="^" + reason.replace("[", r"\[").replace("]", r"\]")) as info:
        parse_metrics_line(line)
    assert info.value.reason == str(info.value)


def test_deep_nesting_is_a_bad_line_not_a_crash() -> None:
    with pytest.raises(BadLine, match="not JSON"):
        parse_metrics_line(b"[" * 100_000 + b"]" * 100_000)


def test_metrics_file_reports_bad_lines_by_number_and_keeps_the_good_ones(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_bytes(
        b'{"step":1,"data":{"a":1}}\n'
        b"Traceback (most recent call last):\n"
        b"\n"
        b'{"step":2,"data":{"a":2}}\r\n'
        b'{"step":-5,"data":{}}\n'
        b'{"step":3,"data":{"a":3}}\n'
    )
    source = MetricsFile(path)
    batch = source.poll()
    assert batch.items[0] == NewSegment(0)
    assert [r.step for r in records(batch)] == [1, 2, 3]
    assert [(b.line_number, b.segment) for b in batch.bad_lines] == [(2, 0), (5, 0)]
    report = batch.bad_lines[0]
    assert report.path == path
    assert str(report).startswith(f"{path}:2 (segment 0): not JSON")


def test_metrics_file_numbers_lines_per_segment_and_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    source = MetricsFile(path)
    path.write_bytes(b'{"step":0,"data":{}}\n{"step":1,"data":{}}\n{"step":2,')
    assert [r.step for r in records(source.poll())] == [0, 1]
    with open(path, "r+b") as handle:  # verl restarted: open(path, "wb") truncates in place
        handle.truncate(0)
        handle.write(b'{"step":1,"data":{"r":1}}\nbroken\n{"step":2,"data":{}}\n')
    batch = source.poll()
    assert batch.items[0] == NewSegment(1)
    assert [r.step for r in records(batch)] == [1, 2]
    assert batch.bad_lines == [BadLineReport(path, 1, 2, batch.bad_lines[0].reason)]
    assert source.poll() == MetricsBatch(items=[], bad_lines=[])


def test_oversized_lines_are_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_bytes(b'{"step":1,"data":{}}\n{"step":2,"data":{"x":"' + b"x" * 200 + b'"}}\n{"step":3,"data":{}}\n')
    batch = MetricsFile(path, max_line_bytes=100).poll()
    assert [r.step for r in records(batch)] == [1, 3]
    assert len(batch.bad_lines) == 1
    assert batch.bad_lines[0].line_number == 2
    assert "longer than 100 bytes" in batch.bad_lines[0].reason


def test_read_all_streams_in_pieces_and_reads_an_unterminated_last_line(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_bytes(
        b"".join(b'{"step":%d,"data":{"v":%d}}\n' % (i, i) for i in range(500)) + b'{"step":500,"data":{}}'
    )
    pieces = list(iter_records(path, max_poll_bytes=4096))
    assert len(pieces) > 3
    steps, bad = read_all(path, max_poll_bytes=4096)
    assert [r.step for r in steps] == list(range(501))
    assert bad == []


def test_read_all_of_a_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_all(tmp_path / "nope.jsonl")


def test_real_thirty_step_run_parses() -> None:
    steps, bad = read_all(RUN / "metrics-30-steps.jsonl")
    assert bad == []
    assert [r.step for r in steps] == list(range(31))
    assert "actor/entropy" in steps[5].data
    assert all(math.isfinite(v) for v in steps[5].data.values())


@pytest.mark.parametrize("name", sorted(p.name for p in RUN.glob("metrics-*.jsonl")) if RUN.is_dir() else [])
def test_every_real_metrics_file_parses_cleanly(name: str) -> None:
    steps, bad = read_all(RUN / name)
    assert bad == []
    assert steps


def test_traces_with_nan_tokens_parse_to_nan() -> None:
    steps, bad = read_all(TRACES / "tinyzero-exp-nan-1.jsonl")
    assert bad == []
    by_step = {r.step: r.data for r in steps}
    assert math.isnan(by_step[91]["grad_norm"])
    assert by_step[91]["score"] == 0.0
    assert sum(math.isnan(v) for r in steps for v in r.data.values()) == 8


def test_every_trace_parses_without_bad_lines() -> None:
    for path in sorted(TRACES.glob("*.jsonl")):
        steps, bad = read_all(path)
        assert bad == [], path
        assert steps, path


# ------------------------------------------------------------------------------ damage stays contained


def test_a_key_with_invalid_utf8_costs_that_key_only(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "run.jsonl"
    path.write_bytes(
        b'{"step":1,"data":{"actor/entropy":0.5,"bad\xff\xfekey":1.0,"critic/score/mean":0.25}}\n'
        b'{"step":2,"data":{"lone\\udc80":2.0,"caf\xc3\xa9":3.0,"name":"x\xff"}}\n'
    )
    source = MetricsFile(path)
    with caplog.at_level("WARNING", logger="guardian"):
        batch = source.poll()
    assert batch.bad_lines == []
    assert [(r.step, dict(r.data)) for r in records(batch)] == [
        (1, {"actor/entropy": 0.5, "critic/score/mean": 0.25}),
        (2, {"café": 3.0}),  # valid non-ASCII keys stay; a string value is no metric anyway
    ]
    assert source.invalid_keys_dropped == 2
    dropped = [r.getMessage() for r in caplog.records if "metrics_keys_dropped" in r.getMessage()]
    assert dropped == [
        f"event=metrics_keys_dropped path={path} segment=0 line=1 step=1 reason=invalid_utf8 dropped=1 kept=2",
        f"event=metrics_keys_dropped path={path} segment=0 line=2 step=2 reason=invalid_utf8 dropped=1 kept=1",
    ]


def test_a_step_with_too_many_keys_keeps_the_read_keys_and_the_first_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # the exact checked keys are kept beyond the cap; the val-core/ key is one of the 10 others
    path = tmp_path / "run.jsonl"
    many = {f"per_sample/{i}": float(i) for i in range(30)}
    with path.open("wb") as out:
        for step in (1, 2):
            data = {**many, "actor/entropy": 0.5, "val-core/gsm8k/acc/mean@1": 0.7, "critic/score/mean": 0.1}
            out.write(orjson.dumps({"step": step, "data": data}) + b"\n")
    source = MetricsFile(path, max_keys=10)
    with caplog.at_level("WARNING", logger="guardian"):
        got = records(source.poll())
    assert [r.step for r in got] == [1, 2]
    expected = {f"per_sample/{i}" for i in range(9)} | {
        "actor/entropy",
        "val-core/gsm8k/acc/mean@1",
        "critic/score/mean",
    }
    assert all(set(r.data) == expected for r in got)
    assert source.capped_keys_dropped == 42
    dropped = [r.getMessage() for r in caplog.records if "metrics_keys_dropped" in r.getMessage()]
    assert dropped == [  # once per file, with the first step's count
        f"event=metrics_keys_dropped path={path} segment=0 line=1 step=1 reason=over_10_keys dropped=21 kept=12"
    ]
    assert len(parse_line(orjson.dumps({"step": 1, "data": many}), max_keys=100).record.data) == 30


def test_every_step_arrives_once_when_the_file_is_replaced_with_unread_lines(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"

    def lines(steps: range) -> bytes:
        return b"".join(orjson.dumps({"step": s, "data": {"a": float(s)}}) + b"\n" for s in steps)

    path.write_bytes(lines(range(1, 4)))
    source = MetricsFile(path)
    seen = [r.step for r in records(source.poll())]
    with path.open("ab") as out:  # three steps the guardian has not read yet
        out.write(lines(range(4, 7)))
    staged = tmp_path / "run.jsonl.new"
    staged.write_bytes(lines(range(7, 9)))
    staged.replace(path)
    batch = source.poll()
    seen += [r.step for r in records(batch)]
    assert seen == list(range(1, 9))
    assert batch.items[3] == NewSegment(1)  # after the drained steps 4-6, before 7
    source.close()


@pytest.mark.slow
def test_a_hundred_megabyte_line_is_skipped_without_being_held(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with path.open("wb") as out:
        out.write(b'{"step":1,"data":{"a":1}}\n{"step":2,"data":{"x":"')
        block = b"x" * (1 << 20)
        for _ in range(100):
            out.write(block)
        out.write(b'"}}\n{"step":3,"data":{"a":3}}\n')
    source = MetricsFile(path)
    steps: list[int] = []
    bad: list[BadLineReport] = []
    tracemalloc.start()
    try:
        while True:
            batch = source.poll()
            steps += [r.step for r in records(batch)]
            bad += batch.bad_lines
            if not batch.more:
                break
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert steps == [1, 3]
    assert [(b.line_number, b.reason) for b in bad] == [(2, f"line longer than {MAX_LINE_BYTES} bytes, skipped")]
    assert peak < 2 * MAX_LINE_BYTES + (8 << 20), f"peak {peak} bytes"
