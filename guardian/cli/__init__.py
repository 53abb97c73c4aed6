"""``guardian`` command line: one module per command, each ``register``-ing its parser; each is ``main(argv) -> int``.

Exit codes: 0 ok / healthy, 1 error, 2 usage, 3 unhealthy run (replay, watch, a failed checklist item).
``--json`` prints one JSON document on stdout; logs go to stderr. What a command does lives in ``guardian.commands``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from guardian import __version__
from guardian.cli import (
    checklist,
    checkpoints,
    dashboards,
    fleet,
    incidents,
    replay,
    report,
    run,
    setup,
    stop,
    watch,
)
from guardian.cli.common import guardian_home, log, write_traceback
from guardian.config import ConfigError
from guardian.exits import EXIT_ERROR, EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE
from guardian.home import StoreNotFoundError
from guardian.logs import event, init_logging
from guardian.store import StoreError
from guardian.verl_keys import PatchError

__all__ = ["EXIT_ERROR", "EXIT_OK", "EXIT_UNHEALTHY", "EXIT_USAGE", "build_parser", "main"]
COMMANDS = (replay, watch, incidents, checklist, report, checkpoints, setup, run, stop, fleet, dashboards)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="guardian", description="Guard a verl RL training run.")
    parser.add_argument("--version", action="version", version=f"verl-guardian {__version__}")
    parser.add_argument(
        "--log-level",
        help="DEBUG, INFO, WARNING, ERROR on the terminal (default INFO; in a terminal, guardian run's live view "
        "shows WARNING and up, the demo's narration CRITICAL only; every line goes to the run's guardian.log)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument(
            "--config",
            help="guardian.yaml (default: ./guardian.yaml, else the project's or the home's, else built-in defaults; "
            "env overrides apply)",
        )
        return p

    for command in COMMANDS:
        command.register(add)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        init_logging(args.log_level)
    except ValueError:
        parser.error(f"--log-level {args.log_level!r}: not a level (DEBUG, INFO, WARNING, ERROR)")
    try:
        code: int = args.func(args)
        return code
    except StoreNotFoundError as exc:  # a command that reads the history, pointed at a home without one
        log.error(event("no_store", {"message": str(exc)}))
        return EXIT_ERROR
    except ConfigError as exc:
        log.error(str(exc))
        return EXIT_USAGE
    except PatchError as exc:  # a training command the guardian cannot read or patch
        log.error(event("bad_command", {"message": str(exc)}))
        return EXIT_USAGE
    except StoreError as exc:
        log.error(event("store_error", {"message": str(exc)}))
        return EXIT_ERROR
    except OSError as exc:  # last resort: a file the command could not use, named with the error
        log.error(event("os_error", {"file": exc.filename, "error": exc.strerror or str(exc)}))
        return EXIT_ERROR
    except Exception as exc:  # last resort: one line here, the traceback in a file under the guardian home
        where = write_traceback(guardian_home(args), exc, time.time())
        message = f"internal error: {type(exc).__name__}: {exc}"
        log.error(event("internal_error", {"message": message, "traceback": where or "not written"}))
        return EXIT_ERROR
