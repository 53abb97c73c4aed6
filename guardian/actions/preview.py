"""What ``guardian run --dry-run`` prints: the first attempt's command, what the guardian added to it, and why.

For a launch script it also says the script must forward its arguments (``"$@"``) and that what the script sets
itself stays unknown. Pure: no processes, no files.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from guardian.actions.patch import AttemptFiles
from guardian.overrides import parse_command


def launch_preview(command: Sequence[str], files: AttemptFiles, cwd: Path) -> dict[str, object]:
    """The dry run's document: ``argv`` as launched, ``appended`` (the guardian's arguments), ``env`` (exported)."""
    given = set(command)
    document: dict[str, object] = {
        "argv": list(files.argv),
        "appended": [a for a in files.argv if a not in given],
        "env": dict(files.env),
        "cwd": str(cwd),
    }
    cmd = parse_command(command)
    if cmd.script:
        document["script"] = {
            "path": cmd.entry,
            "needs": 'its python command must end in "$@": the appended arguments and exported variables reach '
            "the trainer only through it (else: event=arguments_not_forwarded at the first step)",
            "unknown": "what the script sets itself, until an attempt prints its config (a relaunch's patch reads "
            "it there); the guardian reads the arguments after the script and appends its own last (Hydra: the "
            "last value wins)",
        }
    return document
