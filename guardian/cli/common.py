"""What every command shares: exit codes, the resolved configuration, the store, JSON output."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import orjson

from guardian.atomic import write_atomically
from guardian.config import ConfigError, GuardianConfig
from guardian.home import StoreNotFoundError, locate
from guardian.logs import event, get_logger
from guardian.redact import scrub_text
from guardian.store import Store

STORE_INT_MAX = 2**31 - 1  # the largest id the store's columns hold on both backends (PostgreSQL's INTEGER)
SEVERITY_STYLE = {"warn": "yellow", "critical": "bold red", "ok": "green", "unknown": "dim"}
log = get_logger("cli")

Command = Callable[[argparse.Namespace], int]


class AddCommand(Protocol):
    """Adds one ``guardian NAME`` sub-command (with ``--config``) and returns its parser."""

    def __call__(self, name: str, help_text: str) -> argparse.ArgumentParser: ...


def store_int(text: str) -> int:
    """argparse type: a positive integer the store can hold (an id, a limit)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if not 0 < value <= STORE_INT_MAX:
        raise argparse.ArgumentTypeError(f"expected a positive integer up to {STORE_INT_MAX}, got {text}")
    return value


def iso_datetime(text: str) -> datetime:
    """argparse type: an ISO 8601 date or date and time (``2026-12-01``, ``2026-12-01T18:30``, with an offset or
    ``Z``); one without a zone is read as UTC (the store's clock)."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO date or date-time such as 2026-12-01 or 2026-12-01T18:30:00Z, got {text!r}"
        ) from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def print_json(document: object) -> None:
    sys.stdout.write(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode() + "\n")


def resolved_config(args: argparse.Namespace, *, reads_history: bool = False, store: bool = True) -> GuardianConfig:
    """The configuration and home by ``guardian.home``'s rule, with ``--export PORT`` applied; logs one
    ``event=using`` line naming the home, the store (when the command uses one: ``store``) and the config file.
    ``reads_history``: the command reads what is stored, so no store where the home says is an error
    (``StoreNotFoundError``), and none is created."""
    located = locate(getattr(args, "config", None))
    log.info(event("using", located.fields(store=store)))
    problem = located.missing_store() if reads_history else None
    if problem is not None:
        raise StoreNotFoundError(problem)
    config = located.config
    port = getattr(args, "export", None)
    if port is not None:  # --export PORT: the exporter on, on loopback
        config = config.model_copy(
            update={"exporter": config.exporter.model_copy(update={"enabled": True, "port": port})}
        )
    return config


def open_store(config: GuardianConfig) -> Store:
    return Store.open(
        config.database_url(),
        busy_timeout_s=config.store.busy_timeout_s,
        statement_timeout_s=config.store.statement_timeout_s,
    )


def file_problem(path: Path, what: str) -> str | None:
    """Why ``path`` cannot be read as the file ``what`` names (None when it is a file)."""
    if path.is_file():
        return None
    if path.is_dir():
        return f"{what} {path} is a directory, expected a file"
    if path.exists():
        return f"{what} {path} is not a regular file"
    return f"{what} {path} does not exist"


def dir_problem(path: Path, what: str) -> str | None:
    """Why ``path`` cannot be read as the folder ``what`` names (None when it is a folder)."""
    if path.is_dir():
        return None
    if path.exists():
        return f"{what} {path} is not a directory"
    return f"{what} {path} does not exist"


def guardian_home(args: argparse.Namespace) -> Path:
    """The guardian home the command used (``guardian.home``'s rule), else the temp folder."""
    try:
        return locate(getattr(args, "config", None)).home.path
    except (ConfigError, OSError):
        return Path(tempfile.gettempdir())


def write_traceback(home: Path, exc: BaseException, now: float) -> Path | None:
    """Write ``exc``'s full traceback to ``<home>/logs/`` (the temp folder if that cannot be written), scrubbed of
    secrets (``guardian.redact.scrub_text``: a URL's password, libpq's ``password=``, the stores' URLs); the file
    written, None if neither could be."""
    text = scrub_text("".join(traceback.format_exception(exc))).encode()
    name = f"internal-error-{datetime.fromtimestamp(now, tz=UTC):%Y%m%dT%H%M%SZ}-{os.getpid()}.log"
    for folder in (home / "logs", Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            write_atomically(folder / name, text)
        except OSError:
            continue
        return folder / name
    return None
