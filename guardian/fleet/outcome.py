"""How a fleet ended: each run's exit code and what it means, and the fleet's own exit code. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from guardian.exits import EXIT_ERROR, EXIT_GAVE_UP, EXIT_INTERRUPTED, EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE

MEANING: Mapping[int, str] = {
    EXIT_OK: "finished",
    EXIT_ERROR: "error (its guardian.log says why)",
    EXIT_USAGE: "bad command or configuration",
    EXIT_UNHEALTHY: "unhealthy, or a rescue left unproven",
    EXIT_GAVE_UP: "gave up: do not requeue it as is",
    EXIT_INTERRUPTED: "guardian stopped, trainer left running",
}


def meaning(code: int) -> str:
    return MEANING.get(code, f"the trainer's exit code {code}")


def already_over(status: str, code: int) -> str:
    """A fleet summary's words for a run the store recorded as over, which the fleet did not launch again."""
    if status == "gave_up":
        return f"already gave up (exit {code}): do not requeue it as is; a new run_id starts it anew"
    return f"already finished (exit {code}); a new run_id starts it anew"


def fleet_exit(codes: Mapping[str, int], *, interrupted: bool) -> int:
    """The fleet's exit code: 0 when every run finished; the guardian was stopped: 130; else the code every run
    that did not finish shares (93 when each of them gave up), or 1 when they differ (the summary names each)."""
    if interrupted:
        return EXIT_INTERRUPTED
    failed = {code for code in codes.values() if code != EXIT_OK}
    if not failed:
        return EXIT_OK
    return failed.pop() if len(failed) == 1 else EXIT_ERROR
