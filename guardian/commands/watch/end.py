"""When ``guardian watch`` stops reading, decided from what is known of the run. Pure.

In order: bytes left in the file are read first; with ``--no-follow`` the file's end ends the watch; following, the
run ends at ``trainer.total_training_steps`` or once the ``--pid`` trainer exited (its file read to the end after);
otherwise keep following: a silent file with no trainer to ask is the stall check's warning, not an end.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class FileState(StrEnum):
    MISSING = "missing"  # not there (yet)
    UNREAD = "unread"  # holds more bytes than one poll reads
    AT_END = "at_end"  # read to its current end


class EndReason(StrEnum):
    END_OF_FILE = "end_of_file"
    TOTAL_STEPS = "total_steps"
    TRAINER_EXITED = "trainer_exited"
    INTERRUPTED = "interrupted"  # Ctrl-C or SIGTERM: decided by the loop, not by this rule
    TICK_FAILURES = "tick_failures"  # too many failed ticks in a row: decided by the loop
    UNREADABLE = "unreadable"  # the watched path became unreadable (a directory, no permission): by the loop
    TICK_LIMIT = "tick_limit"


@dataclass(frozen=True, slots=True)
class WatchState:
    """What the loop knows after a tick. ``trainer_alive`` was sampled before the tick's read."""

    follow: bool
    file: FileState
    last_step: int | None
    total_steps: int | None
    trainer_alive: bool | None


def end_reason(state: WatchState) -> EndReason | None:
    """Why the watch ends now, or None to keep reading (the module docstring has the rule)."""
    if state.file is FileState.UNREAD:
        return None
    if not state.follow:
        return EndReason.END_OF_FILE
    if state.total_steps is not None and state.last_step is not None and state.last_step >= state.total_steps:
        return EndReason.TOTAL_STEPS
    if state.trainer_alive is False:
        return EndReason.TRAINER_EXITED
    return None
