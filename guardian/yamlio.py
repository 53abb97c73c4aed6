"""The one way the guardian reads YAML: ``load_yaml`` refuses a key given twice in one mapping (naming file,
line and key), says where each key stands, and words a syntax error without quoting the file.
Used for every YAML the guardian reads. Why: docs/decisions/0061-yaml-duplicate-keys.md."""

from __future__ import annotations

import re
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from guardian.redact import printable

MERGE_TAG = "tag:yaml.org,2002:merge"
MAX_KEY_SHOWN = 64
_QUOTED = re.compile(r"'[^']{5,}'|\"[^\"]{5,}\"")  # a quote of the file in PyYAML's words (an alias, a tag): not shown
_PLAIN_KEY = re.compile(rf"[\w.\-]{{1,{MAX_KEY_SHOWN}}}", re.ASCII)

KeyPath = tuple[Hashable, ...]


class YamlError(ValueError):
    """The text is not valid YAML, or repeats a key; the message names where (``what``), the line and the key."""


@dataclass(frozen=True, slots=True)
class Loaded:
    """A YAML document as loaded (``data``), and the 1-based line of each mapping key and sequence item by its path
    (``("runs", 0, "run_id")``: the line of the first run's ``run_id:``)."""

    data: Any
    lines: dict[KeyPath, int] = field(default_factory=dict)

    def line_of(self, path: KeyPath) -> int | None:
        """The line of ``path`` or, when it was not written (a missing key), of the nearest part above it."""
        for end in range(len(path), 0, -1):
            line = self.lines.get(tuple(path[:end]))
            if line is not None:
                return line
        return None


def shown_key(node: Node) -> str:
    """A mapping key for a message: as written (a scalar's text) and quoted when it is a plain word of up to
    ``MAX_KEY_SHOWN`` characters; otherwise not shown (the file may be one of secrets, named by mistake)."""
    text = node.value if isinstance(node, ScalarNode) else ""
    return repr(text) if _PLAIN_KEY.fullmatch(text) else "(not shown: not a plain word)"


def load_yaml(text: str, what: str, *, loader: type[yaml.SafeLoader] = yaml.SafeLoader) -> Loaded:
    """The single YAML document in ``text`` (``what`` names it in messages: ``config file g.yaml``), loaded with
    ``loader`` (a ``SafeLoader`` or a subclass); ``YamlError`` when it is not valid YAML or a mapping gives a key
    twice."""
    try:
        reader = loader(text)  # its reader refuses control characters (NUL) at once
    except yaml.YAMLError as exc:
        raise YamlError(f"{what} is not valid YAML: {printable(type(exc).__name__)}") from None
    try:
        node = reader.get_single_node()
        if node is None:
            return Loaded(None)
        lines: dict[KeyPath, int] = {}
        _walk(reader, node, (), lines, what, set())
        return Loaded(reader.construct_document(node), lines)
    except yaml.MarkedYAMLError as exc:
        raise YamlError(f"{what} is not valid YAML: {_syntax(exc)}") from None
    except yaml.YAMLError as exc:
        raise YamlError(f"{what} is not valid YAML: {printable(type(exc).__name__)}") from None
    except RecursionError:
        raise YamlError(f"{what} is nested too deeply to be a settings file") from None
    finally:
        reader.dispose()


def _syntax(exc: yaml.MarkedYAMLError) -> str:
    """``line L column C: reason`` from PyYAML's marks and words, never its quote of the file."""
    mark = exc.problem_mark or exc.context_mark
    where = f"line {mark.line + 1} column {mark.column + 1}: " if mark is not None else ""
    words = "; ".join(printable(_QUOTED.sub("'...'", part), 120) for part in (exc.context, exc.problem) if part)
    return where + (words or "cannot be read")


def _walk(
    reader: yaml.SafeLoader, node: Node, path: KeyPath, lines: dict[KeyPath, int], what: str, seen: set[int]
) -> None:
    """Record the line of every key and item under ``node`` and refuse a key its mapping already gave."""
    if id(node) in seen:  # an alias of a node already walked
        return
    seen.add(id(node))
    if isinstance(node, SequenceNode):
        for index, item in enumerate(node.value):
            lines.setdefault((*path, index), item.start_mark.line + 1)
            _walk(reader, item, (*path, index), lines, what, seen)
    elif isinstance(node, MappingNode):
        first: dict[Hashable, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_TAG:
                _walk(reader, value_node, path, {}, what, seen)
                continue
            key = _key(reader, key_node)
            line = key_node.start_mark.line + 1
            if key in first:
                raise YamlError(
                    f"{what} line {line}: key {shown_key(key_node)} is given twice (first on line {first[key]}); the "
                    "second would silently replace the first: keep one"
                )
            first[key] = line
            lines[(*path, key)] = line
            _walk(reader, value_node, (*path, key), lines, what, seen)


def _key(reader: yaml.SafeLoader, node: Node) -> Hashable:
    """A mapping key as loaded (a scalar's value by its resolved tag: ``01`` is 1), or a stand-in for a complex key
    that keeps two different ones apart."""
    if isinstance(node, ScalarNode):
        try:
            value = reader.construct_object(node, deep=True)
        except yaml.YAMLError:
            return (node.tag, node.value)
        if isinstance(value, Hashable):
            return value
    return (node.tag, id(node))
