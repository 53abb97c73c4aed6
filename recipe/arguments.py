"""Command-line value types shared by the recipe's commands."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def integer_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer of at least ``minimum`` (argparse reports the rest as the option's error)."""

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = "integer"  # argparse's "invalid integer value: 'x'"
    return parse


POSITIVE = integer_at_least(1)
NON_NEGATIVE = integer_at_least(0)


def positive_seconds(text: str) -> float:
    """An argparse ``type``: a finite number of seconds above zero."""
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text}")
    return value


positive_seconds.__name__ = "seconds"
POSITIVE_SECONDS = positive_seconds
