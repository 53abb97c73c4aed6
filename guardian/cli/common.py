"""What every command shares: exit codes, the resolved configuration, the store, JSON output."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import orjson

from guardian.config import GuardianConfig, load_config
from guardian.logs import get_logger
from guardian.store import Store

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNHEALTHY = 0, 1, 2, 3
SEVERITY_STYLE = {"warn": "yellow", "critical": "bold red", "ok": "green", "unknown": "dim"}
log = get_logger("cli")

Command = Callable[[argparse.Namespace], int]


class AddCommand(Protocol):
    """Adds one ``guardian NAME`` sub-command (with ``--config``) and returns its parser."""

    def __call__(self, name: str, help_text: str) -> argparse.ArgumentParser: ...


def print_json(document: object) -> None:
    sys.stdout.write(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode() + "\n")


def resolved_config(args: argparse.Namespace) -> GuardianConfig:
    """guardian.yaml (``--config``) or the defaults, with ``--export PORT`` applied."""
    config = load_config(Path(args.config) if args.config else None)
    port = getattr(args, "export", None)
    if port is not None:  # --export PORT: the exporter on, on loopback
        config = config.model_copy(
            update={"exporter": config.exporter.model_copy(update={"enabled": True, "port": port})}
        )
    return config


def open_store(config: GuardianConfig) -> Store:
    return Store.open(config.database_url())
