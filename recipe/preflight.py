"""Check that this Python has what the recipe's steps import, before any of them runs.

    python -m recipe.preflight

run.sh runs it first (in step 1). It imports nothing it checks, only looks each module up, so it takes well under
a second. Exit 0 with one line naming what was found, or 1 with one line naming what is missing and how to
install it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from collections.abc import Sequence
from typing import Final

RECIPE_EXTRA: Final = "verl-guardian[recipe]"
"""The install that brings :data:`REQUIREMENTS` (pyproject.toml's ``recipe`` extra)."""

REQUIREMENTS: Final[dict[str, str]] = {
    # import name: distribution name, as pyproject.toml's `recipe` extra lists them (a test keeps the two equal)
    "pyarrow": "pyarrow",
    "bm25s": "bm25s",
    "numba": "numba",
    "Stemmer": "PyStemmer",
    "tqdm": "tqdm",
    "fastapi": "fastapi",
    "uvicorn": "uvicorn",
    "h11": "h11",
    "httpx": "httpx",
}
"""What the recipe's own steps import beyond the guardian's dependencies: data, index, retrieval server."""

VERL: Final = "verl"
"""The trainer: the user's own install (verl 0.9.1 with vLLM; torch, Ray and datasets come with it)."""


def missing_modules(names: Sequence[str]) -> list[str]:
    """The modules of ``names`` this Python cannot find (looked up, not imported)."""
    return [name for name in names if importlib.util.find_spec(name) is None]


def version_of(distribution: str) -> str:
    """The installed version of ``distribution``, or ``?`` when it has no metadata (on ``PYTHONPATH`` only)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def check() -> tuple[bool, str]:
    """Whether the recipe can run with this Python, and the one line that says so."""
    python = sys.executable
    problems: list[str] = []
    missing = missing_modules(list(REQUIREMENTS))
    if missing:
        named = ", ".join(name if REQUIREMENTS[name] == name else f"{name} ({REQUIREMENTS[name]})" for name in missing)
        problems.append(
            f"the recipe's dependencies are missing from {python}: {named}: {python} -m pip install '{RECIPE_EXTRA}'"
        )
    if missing_modules([VERL]):
        problems.append(
            f"verl is not installed in {python}: install verl 0.9.1 with vLLM, or use the Python that has it"
        )
    if problems:
        return False, "; ".join(problems)
    found = ", ".join(f"{dist} {version_of(dist)}" for dist in REQUIREMENTS.values())
    return True, f"{python} has the recipe's dependencies: {found}, verl {version_of(VERL)}"


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m recipe.preflight", description=__doc__.split("\n\n")[0])
    parser.parse_args(argv)
    ok, line = check()
    print(line, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
