"""The trainer's wrapper: ``python -m guardian.actions.runner --exit-file PATH -- CMD ARGS...``.

It catches SIGINT, SIGTERM and SIGHUP (a caught disposition resets on ``exec``, so the trainer keeps the defaults),
starts CMD, writes ``PATH.pid``, waits, writes the exit status atomically to ``PATH`` and exits with the trainer's
code (128 + N for signal N). Not covered: SIGKILL of the wrapper itself (no exit file).
Why: docs/decisions/0001-trainer-wrapper-and-process-group.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

from guardian.atomic import for_others, write_atomically

SHIELDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
EXIT_CANNOT_START = 127


def pid_file_for(exit_file: Path) -> Path:
    """Where the wrapper records the trainer's pid: ``<exit_file>.pid``."""
    return exit_file.with_name(exit_file.name + ".pid")


def write_json_atomic(path: Path, payload: Mapping[str, object]) -> None:
    """Write ``payload`` as JSON to ``path`` so readers see either nothing or the whole document (an attempt's file:
    readable by others, as the files beside it)."""
    write_atomically(path, (json.dumps(dict(payload), sort_keys=True) + "\n").encode(), mode=for_others())


def _ignore(signum: int, frame: FrameType | None) -> None:
    """No-op handler: keeps the wrapper alive, and (being a handler, not SIG_IGN) is reset to default by exec."""


def _parse(argv: Sequence[str]) -> tuple[Path, list[str]]:
    """Split ``--exit-file PATH -- CMD ARGS...`` at the first ``--``, so CMD's own options are never parsed."""
    argv = list(argv)
    if "--" not in argv:
        own, command = argv, []
    else:
        cut = argv.index("--")
        own, command = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        prog="python -m guardian.actions.runner",
        usage="%(prog)s --exit-file PATH -- CMD ARGS...",
        description="Run a trainer command and record its exit status in a file that outlives the guardian.",
    )
    parser.add_argument("--exit-file", required=True, type=Path, help="where to write the exit status (JSON)")
    args = parser.parse_args(own)
    if not command:
        parser.error("no command given after '--'")
    return Path(args.exit_file), command


def _record(path: Path, payload: Mapping[str, object]) -> None:
    """Write a record; a failure is reported on stderr but never stops the wrapper from waiting for its child."""
    try:
        write_json_atomic(path, payload)
    except OSError as exc:
        sys.stderr.write(f"guardian runner: cannot write {path}: {exc}\n")
        sys.stderr.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the wrapper; returns the exit code it should exit with."""
    for shielded in SHIELDED_SIGNALS:
        signal.signal(shielded, _ignore)
    exit_file, command = _parse(sys.argv[1:] if argv is None else argv)
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        sys.stderr.write(f"guardian runner: cannot start {command[0]!r}: {exc}\n")
        sys.stderr.flush()
        _record(
            exit_file,
            {"exit_code": EXIT_CANNOT_START, "signal": None, "pid": None, "ended_at": time.time(), "error": str(exc)},
        )
        return EXIT_CANNOT_START
    _record(pid_file_for(exit_file), {"pid": child.pid, "runner_pid": os.getpid(), "started_at": time.time()})
    returncode = child.wait()
    exit_code, died_of = (returncode, None) if returncode >= 0 else (None, -returncode)
    _record(exit_file, {"exit_code": exit_code, "signal": died_of, "pid": child.pid, "ended_at": time.time()})
    return returncode if died_of is None else 128 + died_of


if __name__ == "__main__":
    sys.exit(main())
