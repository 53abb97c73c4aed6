"""What ``guardian replay`` makes of the files it is given: the pure sniff of a file's head, and the
command on real files (empty, binary, console logs, partly bad JSONL, bad paths)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import fixture_path

from guardian.cli import EXIT_ERROR, EXIT_UNHEALTHY, EXIT_USAGE, main
from guardian.config import ChecksConfig, SourcesConfig
from guardian.exits import EXIT_TOO_LITTLE
from guardian.history.timeline import RunHistory
from guardian.incidents.replay import replay_file, replay_trace
from guardian.sources.sniff import SAMPLE_BYTES, TraceKind, read_sample, sniff

RUN = ("verl-0.9.1-run",)
CONSOLE_LOG = fixture_path(*RUN, "console-30-steps.log")
SAME_RUN_JSONL = fixture_path(*RUN, "metrics-30-steps.jsonl")


@pytest.fixture(autouse=True)
def guardian_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GUARDIAN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GUARDIAN_DB_URL", raising=False)


# ------------------------------------------------------------------------------------------ sniff (pure)


@pytest.mark.parametrize(
    ("sample", "kind", "described"),
    [
        (b"", TraceKind.EMPTY, "empty"),
        (b"\n  \n\n", TraceKind.EMPTY, "only blank lines"),
        (b"step:1\x00\x00\x00 - a:1\n", TraceKind.BINARY, "binary"),
        (bytes(range(128, 256)) * 8, TraceKind.BINARY, "binary"),
        (b'{"step": 1, "data": {}}\n{"step": 2, "data": {}}\n', TraceKind.METRICS_JSONL, "2 of them"),
        (b'{"loss": 1}\n{"loss": 2}\n[1, 2]\n', TraceKind.JSON_WITHOUT_STEP, "2 JSON object(s), none with a 'step'"),
        (b"hello\nworld\n", TraceKind.NOT_JSON, "2 lines, none of them JSON"),
    ],
)
def test_sniff_names_what_the_file_holds(sample: bytes, kind: TraceKind, described: str) -> None:
    shape = sniff(sample)
    assert shape.kind is kind
    assert described in shape.describe()


def test_sniff_finds_verl_console_lines_among_config_dumps() -> None:
    sample = (
        b"{'actor_rollout_ref': {'actor': {'clip_ratio': 0.2,\n"
        b"WARNING: something\n"
        b"\x1b[36m(TaskRunner pid=1543)\x1b[0m step:1 - actor/entropy:np.float64(1.2) - critic/score/mean:0.5\n"
        b"step:2 - actor/entropy:1.1\n"
    )
    shape = sniff(sample)
    assert shape.kind is TraceKind.CONSOLE
    assert (shape.lines, shape.console_steps) == (4, 2)


def test_sniff_prefers_jsonl_steps_and_drops_a_line_the_sample_cut() -> None:
    sample = b'{"step": 1, "data": {}}\nstep:1 - a:1\n{"step": 2, "da'
    shape = sniff(sample, truncated=True)
    assert shape.kind is TraceKind.METRICS_JSONL
    assert shape.lines == 2  # the cut last line is not counted
    assert f"first {SAMPLE_BYTES >> 20} MiB" in shape.describe()


def test_read_sample_reads_the_head_only(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    path.write_bytes(b"x" * (SAMPLE_BYTES + 10))
    sample, truncated = read_sample(path)
    assert len(sample) == SAMPLE_BYTES and truncated
    path.write_bytes(b"small\n")
    assert read_sample(path) == (b"small\n", False)


# ------------------------------------------------------------------------------------------ replay_trace


def test_a_console_log_is_detected_and_judged_like_its_jsonl() -> None:
    detected = replay_trace(CONSOLE_LOG, ChecksConfig())
    asked = replay_trace(CONSOLE_LOG, ChecksConfig(), console=True)
    jsonl = replay_trace(SAME_RUN_JSONL, ChecksConfig())
    assert detected.console and asked.console and not jsonl.console
    assert detected.shape is not None and detected.shape.kind is TraceKind.CONSOLE
    assert detected.steps == asked.steps >= 30
    assert detected.first_critical is not None and jsonl.first_critical is not None
    assert detected.first_critical.step == asked.first_critical.step == jsonl.first_critical.step  # type: ignore[union-attr]
    assert detected.first_critical.check == jsonl.first_critical.check


# ------------------------------------------------------------------------------------------ the command


def _replay(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["replay", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    ("content", "found"),
    [
        (b"", "found=empty"),
        (b"\x00\x01\x02garbage\xff\xfe" * 100, 'found="binary data, not text"'),
        (b"just some text\nand more\n", 'found="2 lines, none of them JSON"'),
        (b'{"loss": 0.5}\n{"loss": 0.4}\n', "none with a 'step'"),
    ],
)
def test_no_readable_step_exits_2_saying_what_was_found_and_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, found: str
) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(content)
    code, out, err = _replay([str(path), "--json"], capsys)
    assert code == EXIT_USAGE
    assert out == ""  # no verdict is printed for a file that says nothing
    assert "event=no_steps" in err and str(path) in err and found in err
    assert "VERL_FILE_LOGGER_PATH" in err and "--console" in err
    assert "HEALTHY" not in err


def test_a_jsonl_given_as_console_log_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _replay(["--console", str(SAME_RUN_JSONL)], capsys)
    assert code == EXIT_USAGE
    assert "JSON objects with a 'step'" in err and "without --console" in err


def test_console_log_detected_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _replay([str(CONSOLE_LOG), "--json"], capsys)
    assert code == EXIT_UNHEALTHY
    doc = json.loads(out)
    assert doc["format"] == "console" and doc["steps"] >= 30
    assert "event=console_detected" in err


def test_a_partly_bad_file_still_replays_and_counts_its_bad_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = SAME_RUN_JSONL.read_bytes().splitlines(keepends=True)
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"".join(good[:10]) + b"\x00\xff garbage\n{not json\n" + b"".join(good[10:]))
    code, out, err = _replay([str(path), "--json"], capsys)
    assert code == EXIT_UNHEALTHY
    doc = json.loads(out)
    assert doc["bad_lines"] == 2 and doc["steps"] == len(good)
    assert f"event=bad_lines file={path} count=2" in err
    code, out, _ = _replay([str(path)], capsys)
    assert "2 unreadable line(s) skipped" in out


def test_bad_paths_are_errors_naming_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(SAME_RUN_JSONL)
    cases = [
        ([str(tmp_path)], f"trace file {tmp_path} is a directory"),
        ([str(tmp_path / "nope.jsonl")], f"trace file {tmp_path / 'nope.jsonl'} does not exist"),
        (["--console", str(tmp_path)], f"console log {tmp_path} is a directory"),
        ([trace, "--rollouts", str(tmp_path / "gone")], f"--rollouts {tmp_path / 'gone'} does not exist"),
        ([trace, "--rollouts", trace], f"--rollouts {trace} is not a directory"),
    ]
    for argv, message in cases:
        code, out, err = _replay(argv, capsys)
        assert (code, out) == (EXIT_ERROR, ""), argv
        assert message in err, argv


def test_one_input_exactly(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in ([], [str(SAME_RUN_JSONL), "--console", str(CONSOLE_LOG)]):
        code, _, err = _replay(argv, capsys)
        assert code == EXIT_USAGE and "--console FILE" in err


# ------------------------------------------------------------------------------- configured read limits

SMALL_LINE = 1024  # the least sources.max_line_bytes allows
LONG_PAD = "x" * (2 * SMALL_LINE)  # a value that makes its line longer than SMALL_LINE, shorter than the default


def _small_line_config(tmp_path: Path) -> Path:
    config = tmp_path / "guardian.yaml"
    config.write_text(f"sources: {{max_line_bytes: {SMALL_LINE}}}\n")
    return config


def _jsonl_with_a_long_line(tmp_path: Path) -> Path:
    path = tmp_path / "metrics.jsonl"
    lines = [
        json.dumps({"step": step, "data": {"actor/entropy": 0.5, "pad": LONG_PAD if step == 2 else ""}})
        for step in (1, 2, 3)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _console_with_a_long_line(tmp_path: Path) -> Path:
    path = tmp_path / "stdout.log"
    lines = [f"step:{step} - actor/entropy:0.5 - pad:{LONG_PAD if step == 2 else ''}" for step in (1, 2, 3)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("make", "console"), [(_jsonl_with_a_long_line, False), (_console_with_a_long_line, True)], ids=["jsonl", "console"]
)
def test_replay_skips_a_line_longer_than_the_configured_max_line_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Callable[[Path], Path], console: bool
) -> None:
    path = make(tmp_path)
    trace = ["--console", str(path)] if console else [str(path)]
    code, out, _ = _replay([*trace, "--json"], capsys)
    assert code == EXIT_TOO_LITTLE  # three steps: read, and too few to judge
    assert (json.loads(out)["steps"], json.loads(out)["bad_lines"]) == (3, 0)  # the default limit reads it
    code, out, err = _replay(["--config", str(_small_line_config(tmp_path)), *trace, "--json"], capsys)
    assert code == EXIT_TOO_LITTLE
    assert (json.loads(out)["steps"], json.loads(out)["bad_lines"]) == (2, 1)
    assert f"line longer than {SMALL_LINE} bytes, skipped" in err


def test_replay_caps_a_step_at_the_configured_max_keys_per_step(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    data = {f"val-core/x_{i}/acc/mean@1": 0.5 for i in range(50)} | {"actor/entropy": 0.5}
    path.write_text(json.dumps({"step": 1, "data": data}) + "\n")
    history = RunHistory()
    replay_file(path, ChecksConfig(), history=history, sources=SourcesConfig(max_keys_per_step=10))
    assert history.keys_seen == {"actor/entropy"} | {f"val-core/x_{i}/acc/mean@1" for i in range(10)}
