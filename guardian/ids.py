"""Run ids: they name folders (``runs/<run_id>/``), label metrics and log lines, and are typed by users.
One rule keeps all three safe: letters, digits, ``.``, ``_`` and ``-``, starting with a letter or digit, at most
128 characters; no path separator, ``..``, whitespace or control character."""

from __future__ import annotations

import re
from typing import Final

from guardian.config import ConfigError

MAX_RUN_ID: Final = 128
_RUN_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_RUN_ID - 1}}}")


def checked_run_id(text: str, *, option: str = "--run-id") -> str:
    """``text`` if it is a valid run id; ConfigError (a usage error) naming the option and the rule otherwise."""
    if _RUN_ID.fullmatch(text):
        return text
    raise ConfigError(
        f"{option} {text!r} is not a valid run id: use letters, digits, '.', '_' and '-' (starting with a letter "
        f"or digit, at most {MAX_RUN_ID} characters); it names the run's folder under the guardian home"
    )
