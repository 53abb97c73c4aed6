"""Every exit status the guardian's commands end with, in one place (documented in docs/commands.md)."""

from __future__ import annotations

from typing import Final

EXIT_OK: Final = 0  # healthy, finished
EXIT_ERROR: Final = 1  # an error; also the guardian cannot continue (store unavailable too long, ticks failing)
EXIT_USAGE: Final = 2  # bad arguments or configuration; a replay that read no step
EXIT_UNHEALTHY: Final = 3  # the run was unhealthy (replay, watch, observe/advise) or a rescue left unproven
EXIT_TOO_LITTLE: Final = 4  # too little to judge (replay, watch): a handful of steps, or no reward signal
EXIT_GAVE_UP: Final = 93  # the guardian gave up on the run: do not requeue it as is
EXIT_INTERRUPTED: Final = 130  # guardian run stopped by Ctrl-C / SIGTERM; the trainer was left running
