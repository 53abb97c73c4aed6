"""verl ``console`` logger lines, with and without Ray prefixes, and the real run's stdout log."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from conftest import FIXTURES

from guardian.core import StepRecord
from guardian.sources.console import ConsoleFile, console_value, iter_console_records, parse_console_line
from guardian.sources.jsonl import read_all
from guardian.sources.tail import NewSegment

RUN = FIXTURES / "verl-0.9.1-run"


@pytest.mark.parametrize(
    "prefix",
    [
        "",
        "(TaskRunner pid=123) ",
        "(TaskRunnerV1 pid=1543) ",
        "(TaskRunnerV1 pid=1, ip=10.0.0.1) ",
        "\x1b[36m(TaskRunnerV1 pid=1543)\x1b[0m ",
        "\x1b[36m(pid=2122)\x1b[0m ",
    ],
)
def test_prefixes_and_colour_are_stripped(prefix: str) -> None:
    record = parse_console_line(prefix + "step:4 - actor/entropy:np.float64(0.5) - num_turns/max:np.int64(2)\n")
    assert record == StepRecord(step=4, data={"actor/entropy": 0.5, "num_turns/max": 2.0})


def test_values_keys_and_malformed_pairs() -> None:
    line = (
        "step:7 - a:0.0123 - b:np.float64(0.0123) - c:np.int64(4) - d:np.float32(nan) - e:nan"
        " - f:inf - g:-inf - h:1e-05 - val-core/tiny_copy/acc/mean@1:0.25 - k:-0.5"
        " - nocolon - :3 - flag:True - text:abc - weird:np.float64(x) - l:np.float32(0.1)"
    )
    record = parse_console_line(line)
    assert record is not None
    data = record.data
    assert record.step == 7
    assert data["a"] == data["b"] == 0.0123
    assert data["c"] == 4.0
    assert math.isnan(data["d"]) and math.isnan(data["e"]) and math.isnan(data["f"]) and math.isnan(data["g"])
    assert data["h"] == 1e-05
    assert data["val-core/tiny_copy/acc/mean@1"] == 0.25
    assert data["k"] == -0.5
    assert data["l"] == 0.1
    assert set(data) == {"a", "b", "c", "d", "e", "f", "g", "h", "val-core/tiny_copy/acc/mean@1", "k", "l"}


def test_key_with_colon_splits_on_the_last_colon() -> None:
    record = parse_console_line("step:1 - timing_s/a:b:2.5")
    assert record == StepRecord(step=1, data={"timing_s/a:b": 2.5})


@pytest.mark.parametrize(
    "line",
    [
        "",
        "\x1b[36m(TaskRunnerV1 pid=1543)\x1b[0m                          'enable': False,",
        '\x1b[36m(pid=2122)\x1b[0m   warnings.warn(f"veomni engine is not available: {e!r}", stacklevel=1)',
        "2026-11-30 01:22:14,237\tINFO worker.py:2038 -- Started a local Ray instance.",
        " \"'step': np.int64(2), 'val-aux/num_turns/mean': \"",
        "step:abc - a:1",
        "step:3something - a:1",
        "prefix step:3 - a:1",
    ],
)
def test_non_metric_lines_give_none(line: str) -> None:
    assert parse_console_line(line) is None


def test_bare_step_line_and_carriage_return_redraw() -> None:
    assert parse_console_line("step:9") == StepRecord(step=9, data={})
    assert parse_console_line("progress 50%\rstep:2 - a:1\r\n") == StepRecord(step=2, data={"a": 1.0})


@pytest.mark.parametrize("text", ["True", "False", "", "np.float64()", "(1+2j)", "None", "1" * 500])
def test_console_value_rejects_or_bounds_odd_values(text: str) -> None:
    value = console_value(text)
    assert value is None or math.isnan(value)


def test_console_file_tails_partial_lines_and_undecodable_bytes(tmp_path: Path) -> None:
    path = tmp_path / "stdout.log"
    source = ConsoleFile(path)
    assert source.poll().items == []
    path.write_bytes(b"config dump\n(TaskRunnerV1 pid=1) step:1 - a:1.5 - \xff\xfe:2\n(TaskRunnerV1 pid=1) step:2 - a")
    batch = source.poll()
    assert batch.items == [NewSegment(0), StepRecord(step=1, data={"a": 1.5, "\ufffd\ufffd": 2.0})]
    with open(path, "ab") as handle:
        handle.write(b":2.5\n")
    assert source.poll().items == [StepRecord(step=2, data={"a": 2.5})]
    assert source.path == path and source.segment == 0


def test_console_file_reports_oversized_lines(tmp_path: Path) -> None:
    path = tmp_path / "stdout.log"
    path.write_bytes(b"x" * 100 + b"\nstep:1 - a:1\n")
    batch = ConsoleFile(path, max_line_bytes=50).poll()
    assert batch.items == [NewSegment(0), StepRecord(step=1, data={"a": 1.0})]
    assert [(b.line_number, b.segment) for b in batch.bad_lines] == [(1, 0)]
    assert "longer than 50 bytes" in str(batch.bad_lines[0])


def test_real_console_log_matches_the_jsonl() -> None:
    batch = ConsoleFile(RUN / "console-30-steps.log").poll()
    assert batch.bad_lines == []
    console = [item for item in batch.items if isinstance(item, StepRecord)]
    jsonl, bad = read_all(RUN / "metrics-30-steps.jsonl")
    assert bad == []
    assert [r.step for r in console] == [r.step for r in jsonl] == list(range(31))
    for from_console, from_file in zip(console, jsonl, strict=True):
        assert set(from_console.data) == set(from_file.data), from_file.step
    step5_console, step5_file = console[5].data, jsonl[5].data
    assert len(step5_file) > 50
    for key, value in step5_file.items():
        assert step5_console[key] == pytest.approx(value, rel=1e-9, abs=0.0, nan_ok=True), key


def test_iter_console_records_streams_a_finished_log_in_pieces(tmp_path: Path) -> None:
    whole = ConsoleFile(RUN / "console-30-steps.log").poll()
    pieces = list(iter_console_records(RUN / "console-30-steps.log", max_poll_bytes=4096))
    assert len(pieces) > 2  # bounded reads, not one slurp
    streamed = [record for records, _ in pieces for record in records]
    assert streamed == [item for item in whole.items if isinstance(item, StepRecord)]
    with pytest.raises(FileNotFoundError, match=r"console log .* does not exist"):
        next(iter_console_records(tmp_path / "gone.log"))
