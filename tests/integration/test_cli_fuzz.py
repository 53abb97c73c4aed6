"""Bad input never makes the command line print a traceback: every command is fed missing paths, folders,
empty and binary files, invalid UTF-8, a 10 MB line, NUL bytes, bad ids and bad option values, and
must exit 1 or 2 (or a documented verdict) with a message naming what was wrong. And the last resort of
``main``: an OSError is one line naming the file, any other exception one line pointing at the
traceback written under the guardian home."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import fixture_path

import guardian.cli.replay
from guardian.cli import EXIT_ERROR, EXIT_UNHEALTHY, EXIT_USAGE, main
from guardian.store import Store

GOOD_TRACE = str(fixture_path("traces", "aopd-4.jsonl"))
TINY_TRACE = str(fixture_path("verl-0.9.1-run", "metrics-10-steps.jsonl"))
USAGE_OR_ERROR = {EXIT_ERROR, EXIT_USAGE}


@pytest.fixture(autouse=True)
def guardian_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GUARDIAN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GUARDIAN_DB_URL", raising=False)
    return tmp_path / "home"


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One file (or non-file) per kind of bad input."""
    root = tmp_path_factory.mktemp("bad")
    files = {
        "missing": root / "missing.jsonl",
        "directory": root / "a-folder",
        "empty": root / "empty.jsonl",
        "garbage": root / "garbage.bin",
        "invalid_utf8": root / "latin1.txt",
        "long_line": root / "long-line.jsonl",
        "nul": root / "nul.jsonl",
    }
    files["directory"].mkdir()
    files["empty"].write_bytes(b"")
    files["garbage"].write_bytes(random.Random(7).randbytes(64 << 10))
    files["invalid_utf8"].write_bytes("mode: enforcé\nrun: tëst\n".encode("latin-1"))
    files["long_line"].write_bytes(b'{"step": 1, "data": {"x": "' + b"x" * (10 << 20) + b'"}}')
    files["nul"].write_bytes(b'{"step": 1, "data": {}}\x00\x00\nmode:\x00 observe\n')
    return files


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``main(argv)``'s exit code (argparse's own exit included) and everything it printed."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse rejects the arguments itself: usage on stderr, exit 2
        code = exc.code if isinstance(exc.code, int) else EXIT_ERROR
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def assert_clean(argv: list[str], code: int, output: str, names: str, allowed: set[int]) -> None:
    assert "Traceback" not in output, (argv, output[-2000:])
    assert "event=internal_error" not in output, (argv, output[-2000:])
    assert code in allowed, (argv, code, output[-2000:])
    assert names in output, (argv, names, output[-2000:])


PATH_COMMANDS: dict[str, Callable[[str], list[str]]] = {
    "replay": lambda p: ["replay", p],
    "replay --console": lambda p: ["replay", "--console", p],
    "replay --rollouts": lambda p: ["replay", GOOD_TRACE, "--rollouts", p],
    "watch --metrics": lambda p: ["watch", "--metrics", p, "--no-follow", "--no-live", "--max-ticks", "1"],
    "watch --console": lambda p: ["watch", "--console", p, "--no-follow", "--no-live", "--max-ticks", "1"],
    "watch --rollouts": lambda p: ["watch", "--metrics", TINY_TRACE, "--rollouts", p, "--no-follow", "--no-live"],
    "watch --checkpoints": lambda p: [
        "watch",
        "--metrics",
        TINY_TRACE,
        "--checkpoints",
        p,
        "--no-follow",
        "--no-live",
    ],
    "watch --run-config": lambda p: [
        "watch",
        "--metrics",
        TINY_TRACE,
        "--run-config",
        p,
        "--no-live",
        "--max-ticks",
        "1",
    ],
    "config --config": lambda p: ["config", "--config", p],
    "doctor --config": lambda p: ["doctor", "--json", "--config", p],
    "incidents --config": lambda p: ["incidents", "--config", p, "list"],
    "report --config": lambda p: ["report", "--config", p, "1", "-o", "report.html"],
    "checkpoints --config": lambda p: ["checkpoints", "--config", p, "some-run"],
    "dashboards export -o": lambda p: ["dashboards", "export", "-o", p, "--check"],
}
# inputs that only look bad: an empty guardian.yaml or run config is the defaults, an empty folder a
# rollout dir without dumps; the command goes on to its own verdict
VALID = {
    ("replay --rollouts", "directory"),
    ("watch --rollouts", "directory"),
    ("watch --checkpoints", "directory"),
    *((command, "empty") for command in PATH_COMMANDS if "config" in command),
}
VERDICT_CODES = {0, EXIT_ERROR, EXIT_USAGE, EXIT_UNHEALTHY}


@pytest.mark.parametrize("command", PATH_COMMANDS)
def test_bad_paths_and_files(command: str, bad_files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    for kind, path in bad_files.items():
        argv = ["--log-level", "INFO", *PATH_COMMANDS[command](str(path))]
        code, output = run_cli(argv, capsys)
        if (command, kind) in VALID:
            assert_clean(argv, code, output, "", VERDICT_CODES)
        else:
            assert_clean(argv, code, output, str(path), USAGE_OR_ERROR)


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["incidents", "show", "abc"], "'abc'"),
        (["incidents", "show", "-1"], "-1"),
        (["incidents", "show", "0"], "0"),
        (["incidents", "show", str(2**64)], str(2**64)),
        (["incidents", "show", str(2**31)], str(2**31)),  # beyond PostgreSQL's INTEGER: refused on both backends
        (["incidents", "show", "424242"], "#424242"),
        (["incidents", "list", "--limit", "many"], "'many'"),
        (["incidents", "list", "--limit", str(2**70)], str(2**70)),
        (["report", "abc", "-o", "r.html"], "'abc'"),
        (["report", "0", "-o", "r.html"], "0"),
        (["report", "424242", "-o", "r.html"], "#424242"),
        (["report", "--run", "no-such-run", "-o", "r.html"], "'no-such-run'"),
        (["report", "1"], "-o"),
        (["checkpoints", "no-such-run"], "'no-such-run'"),
        (["checkpoints", "restore", "no-such-run", "--incident", "x"], "'x'"),
        (["checkpoints", "restore", "no-such-run"], "--incident"),
        (["replay", GOOD_TRACE, "--rules", "strict"], "'strict'"),
        (["replay"], "--console"),
        (["watch", "--metrics", GOOD_TRACE, "--pid", "0"], "0"),
        (["watch", "--metrics", GOOD_TRACE, "--total-steps", "ten"], "'ten'"),
        (["watch", "--metrics", GOOD_TRACE, "--export", "http"], "'http'"),
        (["demo", "--scenario", "meltdown"], "'meltdown'"),
        (["--log-level", "LOUD", "doctor"], "'LOUD'"),
        (["no-such-command"], "'no-such-command'"),
    ],
)
def test_bad_ids_and_option_values(
    argv: list[str], names: str, guardian_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Store.open(f"sqlite:///{guardian_home / 'guardian.db'}").close()  # an unknown id in a store (none: said first)
    code, output = run_cli(argv, capsys)
    assert_clean(argv, code, output, names, USAGE_OR_ERROR)


def test_a_binary_config_in_a_real_process(bad_files: dict[str, Path], guardian_home: Path) -> None:
    env = {**os.environ, "GUARDIAN_HOME": str(guardian_home)}
    done = subprocess.run(
        [sys.executable, "-m", "guardian", "config", "--config", str(bad_files["garbage"])],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == EXIT_USAGE
    assert "Traceback" not in done.stderr
    assert f"config file {bad_files['garbage']} is not UTF-8 text" in done.stderr


# ------------------------------------------------------------------------------------------ the last resort


def _failing_replay(exc: BaseException) -> Callable[[object], int]:
    def replay(_args: object) -> int:
        raise exc

    return replay


def test_an_unexpected_os_error_is_one_line_naming_the_file(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    failure = PermissionError(13, "Permission denied", "/data/run/metrics.jsonl")
    monkeypatch.setattr(guardian.cli.replay, "cmd_replay", _failing_replay(failure))
    code, output = run_cli(["replay", GOOD_TRACE], capsys)
    assert code == EXIT_ERROR
    assert output.strip().count("\n") == 0 and "Traceback" not in output
    assert 'event=os_error file=/data/run/metrics.jsonl error="Permission denied"' in output


def test_an_internal_error_points_at_its_traceback_file(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], guardian_home: Path
) -> None:
    monkeypatch.setattr(guardian.cli.replay, "cmd_replay", _failing_replay(RuntimeError("the view went away")))
    code, output = run_cli(["replay", GOOD_TRACE], capsys)
    assert code == EXIT_ERROR
    assert output.strip().count("\n") == 0 and "Traceback" not in output
    assert 'message="internal error: RuntimeError: the view went away"' in output
    written = list((guardian_home / "logs").glob("internal-error-*.log"))
    assert len(written) == 1 and f"traceback={written[0]}" in output
    text = written[0].read_text()
    assert text.startswith("Traceback") and "RuntimeError: the view went away" in text


def test_ctrl_c_is_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guardian.cli.replay, "cmd_replay", _failing_replay(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        main(["replay", GOOD_TRACE])
