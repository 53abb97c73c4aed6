"""The fleet file of ``guardian fleet FILE``: the runs one guardian process guards, each with its own command,
cwd, guardian.yaml, mode and trainer control (Ray Jobs at ``ray_address``); the store and exporter are shared.
Defaults: cwd the file's folder, config the fleet's ``--config``, mode the config's, a local process group.
Relative paths are read from the file's folder; ``command`` is a list or one shell string (docs/commands.md)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from guardian.config import (
    MAX_ERROR_LINES,
    ConfigError,
    GuardianConfig,
    dotted,
    load_config,
    not_a_settings_file,
    parse_yaml,
    read_small_text,
)
from guardian.home import home_in_file
from guardian.ids import MAX_RUN_ID, checked_run_id
from guardian.redact import printable
from guardian.yamlio import Loaded

MAX_FLEET_BYTES = 1 << 20
MAX_RUNS = 64  # threads, trainers and store connections of one process: a bigger fleet is several guardians


class RunEntry(BaseModel):
    """One run of the fleet file, as written."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str = Field(description="The run's id in the store, metrics (run_id label) and run folder.")
    command: list[str] | str = Field(description="The training command: a list of words or one shell string.")
    cwd: Path | None = Field(None, description="Where the command runs; default the fleet file's folder.")
    config: Path | None = Field(None, description="This run's guardian.yaml; default the fleet's.")
    mode: Literal["observe", "advise", "enforce"] | None = Field(None, description="Overrides the config's mode.")
    ray_address: str | None = Field(None, description="Submit the run as Ray Jobs to this dashboard address.")

    @field_validator("run_id")
    @classmethod
    def _run_id(cls, value: str) -> str:
        try:
            return checked_run_id(value, option="run_id")
        except ValueError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str] | str) -> list[str]:
        words = shlex.split(value) if isinstance(value, str) else list(value)
        if not words:
            raise ValueError("the training command is empty")
        return words


class FleetFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    runs: list[RunEntry] = Field(min_length=1, max_length=MAX_RUNS)


@dataclass(frozen=True, slots=True)
class FleetRun:
    """One run to guard: its id, command, folder, guardian.yaml as loaded, and trainer control."""

    run_id: str
    command: tuple[str, ...]
    cwd: Path
    config: GuardianConfig
    ray_address: str | None


def load_fleet(path: Path, fleet_config: GuardianConfig) -> list[FleetRun]:
    """The runs of the fleet file at ``path``; ``ConfigError`` naming the file, the run and the field when the file
    or a run's guardian.yaml is wrong, or two runs share an id. Every run writes to the fleet's store
    (``fleet_config``'s database, whatever its own guardian.yaml says)."""
    what = f"fleet file {printable(path)}"
    text = read_small_text(path, what, limit=MAX_FLEET_BYTES, expected="a fleet YAML file")
    loaded = parse_yaml(text, what)  # a key given twice is refused: a second runs: would drop every run before it
    if not_a_settings_file(loaded.data, FleetFile):
        raise ConfigError(f"{what} is not a fleet file: it has no runs: key (nothing of it is shown)")
    try:
        fleet = FleetFile.model_validate(loaded.data if loaded.data is not None else {})
    except ValidationError as exc:
        raise ConfigError(_validation_text(what, loaded, exc)) from None
    _refuse_repeats(what, [entry.run_id for entry in fleet.runs])
    folder = path.resolve().parent
    return [_resolved(entry, folder, fleet_config) for entry in fleet.runs]


def _resolved(entry: RunEntry, folder: Path, fleet_config: GuardianConfig) -> FleetRun:
    home = fleet_config.home  # the run folders go under the fleet's home unless the run's own file names one
    if entry.config is None:
        config = fleet_config
    else:
        own = entry.config if entry.config.is_absolute() else folder / entry.config
        try:
            config = load_config(own)
        except ConfigError as exc:
            raise ConfigError(f"run {entry.run_id} of the fleet: {exc}") from None
        home = home_in_file(config, own, os.environ) or home
    update: dict[str, object] = {"db_url": fleet_config.database_url(), "home": home}
    if entry.mode is not None:
        update["mode"] = entry.mode
    cwd = entry.cwd if entry.cwd is None or entry.cwd.is_absolute() else folder / entry.cwd
    return FleetRun(
        run_id=entry.run_id,
        command=tuple(entry.command),
        cwd=(cwd or folder).resolve(),
        config=config.model_copy(update=update),
        ray_address=entry.ray_address,
    )


def _refuse_repeats(what: str, run_ids: Sequence[str]) -> None:
    seen: set[str] = set()
    for number, run_id in enumerate(run_ids, start=1):
        if run_id in seen:
            raise ConfigError(f"{what}: runs[{number}] repeats run_id {run_id!r}; each run needs its own")
        seen.add(run_id)


def _validation_text(what: str, loaded: Loaded, err: ValidationError) -> str:
    """``invalid fleet file F:`` and a line per error: where (``runs[2].mode``), the run's id when it has a valid one
    (any other is shown escaped: a newline or NUL in it never starts a line of its own), the line of the file, and
    the reason - never the value of an unknown key."""
    lines = [f"invalid {what}:"]
    errors = err.errors()
    for e in errors[:MAX_ERROR_LINES]:
        loc = tuple(e["loc"])
        where = dotted(loc)
        if len(loc) >= 2 and loc[0] == "runs" and isinstance(loc[1], int):
            run_id = _run_id_at(loaded.data, loc[1])
            where += f" (run {run_id})" if run_id else ""
        line = loaded.line_of(loc)
        at = f" (line {line})" if line is not None else ""
        reason = "unknown key" if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, ")
        lines.append(f"  {where or '(top level)'}: {printable(reason, 300)}{at}")
    if len(errors) > MAX_ERROR_LINES:
        lines.append(f"  ... and {len(errors) - MAX_ERROR_LINES} more")
    return "\n".join(lines)


def _run_id_at(loaded: Any, index: int) -> str | None:
    """The ``run_id`` written for run ``index``, for a message: as is when it is a valid run id, else quoted with
    every control character escaped and cut to the longest id's length."""
    try:
        value = loaded["runs"][index]["run_id"]
    except (KeyError, IndexError, TypeError):
        return None
    if not isinstance(value, str):
        return None
    try:
        return checked_run_id(value)
    except ConfigError:
        return printable(repr(value[:MAX_RUN_ID]) + ("..." if len(value) > MAX_RUN_ID else ""))
