"""The optional extras (``pip install 'verl-guardian[postgres]'``, ...): which modules each brings, and the one line
that says how to get one. The core (guard path, SQLite store, exporter, demo) needs none; each place that uses an
extra calls ``need`` first, so a missing package is one error naming the extra, never a traceback."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class Extra:
    """What an extra brings (said in errors) and the top-level modules that must import for it to work."""

    what: str
    modules: tuple[str, ...]


EXTRAS: Final[Mapping[str, Extra]] = {
    "postgres": Extra("the PostgreSQL driver (psycopg)", ("psycopg",)),
    "grafana": Extra("the Grafana client (grafana-client)", ("grafana_client", "niquests")),
    "wandb": Extra("the wandb package", ("wandb",)),
    "ray": Extra("Ray with its Jobs API (ray[default])", ("ray", "requests")),
}


class MissingExtra(ImportError):
    """A package of an optional extra is not installed; the message names the extra to install."""


def install_line(extra: str) -> str:
    """The command that installs ``extra``."""
    return f"pip install 'verl-guardian[{extra}]'"


def installed(extra: str) -> bool:
    """Whether every module of ``extra`` can be imported (found, not loaded)."""
    return all(_found(module) for module in EXTRAS[extra].modules)


def need(extra: str, user: str) -> None:
    """Raise ``MissingExtra`` ("``user`` needs ..., not installed here: pip install ...") unless ``extra`` is
    installed; ``user`` names what asked for it (a setting, a URL, a command)."""
    if not installed(extra):
        raise MissingExtra(f"{user} needs {EXTRAS[extra].what}, which is not installed here: {install_line(extra)}")


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent that fails to import, or a module without a spec
        return False
