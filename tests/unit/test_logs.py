"""Event lines stay one parseable line whatever the values hold; the story mode's file log."""

from __future__ import annotations

import logging
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from guardian import logs
from guardian.logs import event, get_logger, init_logging, logging_to_file


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """init_logging changes the process's logging: every test here leaves it as it found it."""
    logger = logging.getLogger("guardian")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    saved = (logs._terminal, logs._terminal_level_chosen)
    yield
    for handler in logger.handlers:
        if handler not in handlers:
            handler.close()
    logger.handlers[:], logger.level, logger.propagate = handlers, level, propagate
    logs._terminal, logs._terminal_level_chosen = saved


def fields_of(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in shlex.split(line, posix=True))


def test_plain_values_stay_bare_and_none_is_left_out() -> None:
    assert event("stopped", {"run": "run-a", "step": 12, "why": None}) == "event=stopped run=run-a step=12"


@pytest.mark.parametrize(
    "hostile",
    [
        "x\n2026-12-01 10:00:00,000 CRITICAL guardian.rescue event=gave_up run=other",
        "x\r\nevent=gave_up",
        "a\tb\x00c\x1b[31m",
        "line\u2028separator",
        'quote " and \\ backslash = sign',
        "",
    ],
)
def test_a_value_never_forges_a_line_or_a_field(hostile: str) -> None:
    line = event("finding", {"run": hostile, "check": "kl_drift"})
    assert "\n" not in line and "\r" not in line and "\u2028" not in line and "\x00" not in line
    fields = fields_of(line)
    assert fields["event"] == "finding" and fields["check"] == "kl_drift"
    assert set(fields) == {"event", "run", "check"}


def test_newlines_read_back_escaped() -> None:
    assert event("x", {"run": "a\nb"}) == 'event=x run="a\\nb"'
    assert event("x", {"run": "a\x07b"}) == 'event=x run="a\\x07b"'


def test_log_to_file_keeps_every_line_and_quiets_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    init_logging()
    log = get_logger("test")
    with logging_to_file(tmp_path / "run" / "guardian.log", quiet_terminal=True) as path:
        log.info(event("step_seen", {"step": 1}))
        log.warning(event("finding", {"severity": "warn"}))
    log.info(event("after", {}))
    terminal = capsys.readouterr().err
    assert "event=finding" in terminal and "event=step_seen" not in terminal
    assert "event=after" in terminal  # the terminal's level comes back with the block's end
    written = path.read_text()
    assert "event=step_seen step=1" in written and "event=finding" in written and "event=after" not in written


def test_a_chosen_log_level_keeps_the_terminal_as_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    init_logging("INFO")
    with logging_to_file(tmp_path / "guardian.log", quiet_terminal=True):
        get_logger("test").info(event("step_seen", {"step": 2}))
    assert "event=step_seen step=2" in capsys.readouterr().err


def test_a_quieter_terminal_level_still_keeps_every_info_line_in_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    init_logging("WARNING")
    with logging_to_file(tmp_path / "guardian.log", quiet_terminal=False) as path:
        get_logger("test").info(event("step_seen", {"step": 3}))
    assert "event=step_seen" not in capsys.readouterr().err
    assert "event=step_seen step=3" in path.read_text()
