"""Hydra's override grammar, read with hydra-core's own parser (the one verl's command line goes through).

``parse`` reads one ``key=value``, ``+key=value``, ``++key=value`` or ``~key``; ``parse_value`` one value. Errors
become one line naming the argument. hydra-core loads on the first parse. Sweeps (``k=1,2``) are refused."""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Any, Literal

Op = Literal["", "+", "++", "~"]
_OPS: dict[str, Op] = {"CHANGE": "", "ADD": "+", "FORCE_ADD": "++", "DEL": "~"}
_HOW = "write key=value, +key=value, ++key=value or ~key, and quote a value with spaces, commas or '='"


class OverrideSyntaxError(ValueError):
    """An argument Hydra's grammar refuses; the message names it and says how to write it."""


@dataclass(frozen=True, slots=True)
class Parsed:
    """One override: ``op`` is "", "+", "++" or "~"; ``value_text`` is the raw text after '=' (None: ``~key``)."""

    op: Op
    key: str
    value_text: str | None
    value: Any


@functools.cache
def _parser() -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser  # ~0.2 s and 15 MB: only when used

    return OverridesParser.create()


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> Parsed:
    try:
        override = _parser().parse_override(text)
    except Exception as exc:  # hydra raises HydraException, OverrideParseException and ANTLR errors
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise OverrideSyntaxError(f"{text!r} is not a Hydra override ({reason}): {_HOW}") from None
    key = override.get_key_element().lstrip("+~")
    if not override.key_or_group:
        raise OverrideSyntaxError(f"{text!r} has no key before '=': {_HOW}")
    if override.is_sweep_override():
        raise OverrideSyntaxError(
            f"{text!r} is a sweep (several values), which verl does not run: write a list as {key}=[a,b] "
            f"or a string as {key}='a,b'"
        )
    value_text = text.partition("=")[2] if "=" in text else None
    return Parsed(_OPS[override.type.name], key, value_text, override.value())


def parse(text: str) -> Parsed:
    """The override in ``text``; OverrideSyntaxError when Hydra's grammar refuses it."""
    parsed = _parse(text)
    if isinstance(parsed.value, list | dict):  # cached: each caller gets its own copy
        return Parsed(parsed.op, parsed.key, parsed.value_text, copy.deepcopy(parsed.value))
    return parsed


def parse_value(text: str) -> Any:
    """``text`` typed as Hydra types a value: ``1e-6`` a float, ``[a,b]`` a list, ``'5'`` a string."""
    try:
        return parse(f"k={text}").value
    except OverrideSyntaxError:
        raise OverrideSyntaxError(f"value {text!r} is not valid in a Hydra override: {_HOW}") from None
