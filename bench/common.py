"""Helpers the benchmark scripts share."""

from __future__ import annotations

import math


def json_safe(value: object) -> object:
    """Non-finite floats (an empty sample's NaN) as null, so the output is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
