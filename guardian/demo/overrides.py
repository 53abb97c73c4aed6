"""Hydra command-line overrides applied in struct mode, as verl's Hydra applies them, without composing.

Values are read with hydra-core's parser; struct mode (``key=value`` must exist, ``+key`` must not, ``++key``
either) reproduces Hydra's error messages, so a launcher that works against one works against the other.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from guardian.hydra_overrides import OverrideSyntaxError, parse, parse_value

__all__ = ["Override", "OverrideError", "Tree", "apply_overrides", "flatten", "lookup", "parse_override", "parse_value"]

Tree = dict[str, Any]


class OverrideError(ValueError):
    """An override Hydra would reject; the message is Hydra's (struct mode, grammar)."""


@dataclass(frozen=True, slots=True)
class Override:
    """One parsed ``[+|++]key=value``: ``prefix`` is ``""``, ``"+"`` or ``"++"``."""

    prefix: str
    key: str
    value: Any
    text: str


def parse_override(text: str) -> Override:
    """``[+|++]dotted.key=value``; deletions (``~key``) are not supported by the demo."""
    if text.startswith("~"):
        raise OverrideError(f"Error parsing override '{text}': deleting keys is not supported by the demo trainer")
    if "=" not in text:
        raise OverrideError(
            f"Error parsing override '{text}'\nmismatched input: expected key=value (e.g. trainer.save_freq=10)"
        )
    try:
        parsed = parse(text)
    except OverrideSyntaxError as exc:
        raise OverrideError(f"Error parsing override '{text}'\n{exc}") from None
    return Override(prefix=parsed.op, key=parsed.key, value=parsed.value, text=text)


def lookup(tree: Tree, key: str) -> tuple[bool, Any]:
    """(present, value) of a dotted key in a nested dict."""
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _assign(tree: Tree, key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    node = tree
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[leaf] = copy.deepcopy(value)


def apply_overrides(base: Tree, overrides: list[Override]) -> Tree:
    """``base`` with the overrides applied in order, in Hydra's struct mode; ``base`` is not changed."""
    tree = copy.deepcopy(base)
    for item in overrides:
        present, current = lookup(tree, item.key)
        shown = item.text.lstrip("+")
        if item.prefix == "" and not present:
            leaf = item.key.rsplit(".", 1)[-1]
            raise OverrideError(
                f"Could not override '{item.key}'.\nTo append to your config use +{shown}\n"
                f"Key '{leaf}' is not in struct\n    full_key: {item.key}\n    object_type=dict"
            )
        if item.prefix == "+" and present:
            raise OverrideError(
                f"Could not append to config. An item is already at '{item.key}'.\n"
                f"Either remove + prefix: '{shown}'\n"
                f"Or add a second + to add or override '{item.key}': '++{shown}'"
            )
        if isinstance(current, dict) and not isinstance(item.value, dict) and item.value is not None:
            raise OverrideError(
                f"Error merging override {item.text}: cannot assign a value to the section '{item.key}'"
            )
        _assign(tree, item.key, item.value)
    return tree


def flatten(tree: Tree, prefix: str = "") -> dict[str, Any]:
    """Dotted leaf keys of a nested dict (lists and scalars are leaves)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out
