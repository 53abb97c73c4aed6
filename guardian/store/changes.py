"""Whether the store may have changed since a read: a count of this process's committed writes, and a memo of reads.

``WriteCount`` counts the write transactions committed on one engine (every ``Store`` of one ``Store.open`` shares
it), those that wrote step rows alone apart: what a memo keeps reads no step row. ``StoreMemo`` keeps a read until
the count of the others moves or the read is older than ``max_age_s``: another process's
writes (``guardian incidents close``) are seen within that age. It does not cover reads that must see an
uncommitted transaction of their own (those read the store directly).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, event

from guardian.store.engine import STEPS_ONLY_OPTION, WRITE_OPTION

T = TypeVar("T")


class WriteCount:
    """How many write transactions this process committed on one engine: ``steps`` those that wrote step rows alone
    (``STEPS_ONLY_OPTION``), ``value`` every other."""

    __slots__ = ("steps", "value")

    def __init__(self) -> None:
        self.value = 0
        self.steps = 0

    @classmethod
    def on(cls, engine: Engine) -> WriteCount:
        count = cls()

        def committed(connection: Connection) -> None:
            options = connection.get_execution_options()
            if options.get(STEPS_ONLY_OPTION):
                count.steps += 1
            elif options.get(WRITE_OPTION):
                count.value += 1

        event.listen(engine, "commit", committed)
        return count


@dataclass
class _Entry:
    writes: int
    read_at: float
    value: Any


@dataclass
class StoreMemo:
    """Reads kept while ``writes`` stands still and they are younger than ``max_age_s`` (``clock``: seconds).
    One per reader thread; a value handed out is shared, so callers keep it as it is."""

    writes: WriteCount
    max_age_s: float
    clock: Callable[[], float]
    _entries: dict[Hashable, _Entry] = field(default_factory=dict)

    def read(self, key: Hashable, fetch: Callable[[], T]) -> T:
        entry, now = self._entries.get(key), self.clock()
        if entry is not None and entry.writes == self.writes.value and now - entry.read_at < self.max_age_s:
            value: T = entry.value
            return value
        before = self.writes.value  # a write committed during the read moves the count: the next read refetches
        value = fetch()
        self._entries[key] = _Entry(before, now, value)
        return value
