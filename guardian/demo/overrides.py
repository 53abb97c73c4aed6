"""Hydra-style command-line overrides, in struct mode, without Hydra.

verl is launched as ``python -m verl.trainer.main_ppo key=value +key=value ++key=value`` and Hydra
composes those against verl's YAML in *struct mode*: a plain ``key=value`` must name a key that
exists, ``+key=value`` must name one that does not, ``++key=value`` adds or overrides. The demo
trainer takes the same command line, so this module parses values with Hydra's basic grammar
(``1`` int, ``1e-6`` float, ``true``/``false``, ``null``, ``[a,b]`` lists, ``{k: v}`` dicts, quoted
strings stay strings) and reproduces Hydra's error messages, so a launcher that works against one
works against the other. Interpolations (``${...}``) are kept as plain strings.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

Tree = dict[str, Any]

_INT = re.compile(r"[+-]?(?:0|[1-9][0-9_]*)")
_FLOAT = re.compile(
    r"[+-]?(?:(?:[0-9][0-9_]*)?\.[0-9][0-9_]*(?:[eE][+-]?[0-9]+)?|[0-9][0-9_]*\.?(?:[eE][+-]?[0-9]+)|[0-9][0-9_]*\.)"
)
_SPECIAL_FLOAT = re.compile(r"[+-]?(?:inf|nan)", re.IGNORECASE)
_KEY = re.compile(r"[A-Za-z0-9_\-/@]+(?:\.[A-Za-z0-9_\-/@]+)*")


class OverrideError(ValueError):
    """An override Hydra would reject; the message is Hydra's (struct mode, grammar)."""


@dataclass(frozen=True, slots=True)
class Override:
    """One parsed ``[+|++]key=value``: ``prefix`` is ``""``, ``"+"`` or ``"++"``."""

    prefix: str
    key: str
    value: Any
    text: str


def _primitive(text: str) -> Any:
    token = text.strip()
    lowered = token.lower()
    if lowered == "null":
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    if _INT.fullmatch(token):
        return int(token.replace("_", ""))
    if _FLOAT.fullmatch(token) or _SPECIAL_FLOAT.fullmatch(token):
        return float(token.replace("_", ""))
    return token


class _Parser:
    """Recursive descent over one value: lists, dicts, quoted strings, primitives."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, why: str) -> OverrideError:
        return OverrideError(f"Error parsing override value '{self.text}': {why} at position {self.pos}")

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1

    def value(self, nested: bool) -> Any:
        self.skip_space()
        if self.pos < len(self.text):
            head = self.text[self.pos]
            if head == "[":
                return self.sequence("[", "]", self.value)
            if head == "{":
                return dict(self.sequence("{", "}", self.pair))
            if head in "'\"":
                return self.quoted(head)
        return self.bare(nested)

    def sequence(self, open_: str, close: str, item: Any) -> list[Any]:
        self.pos += 1
        items: list[Any] = []
        self.skip_space()
        if self.pos < len(self.text) and self.text[self.pos] == close:
            self.pos += 1
            return items
        while True:
            items.append(item(True))
            self.skip_space()
            if self.pos >= len(self.text):
                raise self.fail(f"missing '{close}'")
            if self.text[self.pos] == ",":
                self.pos += 1
                continue
            if self.text[self.pos] == close:
                self.pos += 1
                return items
            raise self.fail(f"unexpected '{self.text[self.pos]}'")

    def pair(self, nested: bool) -> tuple[str, Any]:
        self.skip_space()
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] not in ":,}":
            self.pos += 1
        key = self.text[start : self.pos].strip()
        if not key or self.pos >= len(self.text) or self.text[self.pos] != ":":
            raise self.fail("expected 'key: value'")
        self.pos += 1
        return key, self.value(nested)

    def quoted(self, quote: str) -> str:
        self.pos += 1
        out: list[str] = []
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char == "\\" and self.pos + 1 < len(self.text):
                out.append(self.text[self.pos + 1])
                self.pos += 2
                continue
            if char == quote:
                self.pos += 1
                return "".join(out)
            out.append(char)
            self.pos += 1
        raise self.fail("unterminated quoted string")

    def bare(self, nested: bool) -> Any:
        start = self.pos
        depth = 0
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char == "{" and self.text[self.pos - 1 : self.pos] == "$":
                depth += 1
            elif char == "}" and depth:
                depth -= 1
            elif nested and depth == 0 and char in ",]}":
                break
            self.pos += 1
        return _primitive(self.text[start : self.pos])


def parse_value(text: str) -> Any:
    """A value typed like Hydra's grammar: ``1e-6`` is a float, ``[a,b]`` a list of strings."""
    parser = _Parser(text)
    value = parser.value(nested=False)
    parser.skip_space()
    if parser.pos != len(text):
        raise parser.fail("trailing characters")
    return value


def parse_override(text: str) -> Override:
    """``[+|++]dotted.key=value``; deletions (``~key``) are not supported by the demo."""
    if text.startswith("~"):
        raise OverrideError(f"Error parsing override '{text}': deleting keys is not supported by the demo trainer")
    prefix = "++" if text.startswith("++") else "+" if text.startswith("+") else ""
    body = text[len(prefix) :]
    key, eq, raw = body.partition("=")
    if not eq or not _KEY.fullmatch(key):
        raise OverrideError(
            f"Error parsing override '{text}'\nmismatched input: expected key=value (e.g. trainer.save_freq=10)"
        )
    return Override(prefix=prefix, key=key, value=parse_value(raw), text=text)


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
