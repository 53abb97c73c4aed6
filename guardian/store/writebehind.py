"""Write-behind over the store: the guard loop's writes outlive a database that refuses them.

A *unit* (a tick's steps and findings, a checkpoint scan) runs at once; if the database is unavailable it waits,
in order, in a bounded queue that ``retry`` replays with backoff (``event=store_unavailable`` / ``store_recovered``).
A full queue drops and counts new units. A unit refused for a bug is lost: logged, counted, its ``refused`` hook
run. ``committed`` hooks run once, after the commit."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Final

from guardian.backoff import Backoff
from guardian.config import MAX_PENDING_WRITES
from guardian.faults import failure_text, unavailable
from guardian.logs import event, get_logger
from guardian.store.repository import Store

log = get_logger("store")

RETRY_FIRST_S: Final = 1.0
RETRY_MAX_S: Final = 60.0

Unit = Callable[[Store], object]
Committed = Callable[[], None]
Refused = Callable[[BaseException], None]


def outage_fix(error: str, url: str) -> str:
    """What a person does about a database error of the store at ``url``."""
    text = error.lower()
    if "lock timeout" in text:  # PostgreSQL's lock_timeout
        return (
            f"another session holds a lock on a table of {url}: find it (pg_locks joined with pg_stat_activity) and "
            "end it (pg_terminate_backend)"
        )
    if "locked" in text or "busy" in text:
        return f"another process holds a write lock on {url}: find it (fuser or lsof on the file) and end it"
    if "full" in text or "no space left" in text:
        return f"free space on the filesystem of {url}"
    if "malformed" in text or "not a database" in text or "corrupt" in text:
        return (
            f"the database file behind {url} is damaged: copy it aside, rebuild it with sqlite3 FILE .recover, "
            "point GUARDIAN_DB_URL at the rebuilt file and run guardian run --attach RUN_ID"
        )
    if "i/o" in text:
        return f"check the disk under {url} (dmesg)"
    return f"check that the database at {url} is reachable and accepts writes"


@dataclass
class _Pending:
    name: str
    unit: Unit
    atomic: bool
    committed: Committed | None = None
    refused: Refused | None = None
    steps_only: bool = False


@dataclass
class WriteBehind:
    """The guard loop's writes, in order, kept while the store refuses them (see the module docstring)."""

    store: Store
    clock: Callable[[], float]
    limit: int = MAX_PENDING_WRITES
    down_since: float | None = None  # when the current outage began; None while the store takes writes
    dropped: int = 0  # units dropped because the queue was full, over the guardian's life
    failed_units: int = 0  # units the database refused for a non-outage error (a bug), over the guardian's life
    error: str | None = None  # the database's last refusal
    _queue: deque[_Pending] = field(default_factory=deque)
    _next_try: float = 0.0
    _backoff: Backoff = field(default_factory=lambda: Backoff(RETRY_FIRST_S, RETRY_MAX_S))
    _dropped_in_outage: int = 0

    @property
    def degraded(self) -> bool:
        return self.down_since is not None

    @property
    def pending(self) -> int:
        return len(self._queue)

    def submit(
        self,
        name: str,
        unit: Unit,
        *,
        atomic: bool = True,
        coalesce: bool = False,
        committed: Committed | None = None,
        refused: Refused | None = None,
        steps_only: bool = False,
    ) -> None:
        """Run ``unit`` on the store now (``atomic``: in one transaction; else each of its calls commits
        on its own, so a repeat redoes only what is left), or queue it while the store is unavailable.
        ``coalesce``: the unit redoes the whole of its job, so an older queued one of ``name`` is dropped.
        ``committed`` runs once the unit committed (now or in a replay); ``refused`` once it is lost to a
        non-outage error (before ``submit`` raises it, or when a replay drops it). ``steps_only``: an atomic unit that
        writes step rows alone (``Store.transaction``)."""
        if coalesce:
            self._queue = deque(p for p in self._queue if p.name != name)
        pending = _Pending(name, unit, atomic, committed, refused, steps_only)
        if self.degraded:
            self._enqueue(pending)
            return
        try:
            self._run(pending)
        except Exception as exc:
            if unavailable(exc):
                self._enqueue(pending)
                self.failed(exc)
                return
            self._lost(pending, exc, traceback=False)  # the caller gets the error (and logs its traceback)
            raise
        self._committed(pending)

    def failed(self, exc: BaseException) -> None:
        """The store refused work (a unit here, or a write of the caller's own): degraded until ``retry``
        gets through; the first refusal of an outage is logged loudly."""
        now = self.clock()
        self.error = failure_text(exc)
        if self.down_since is None:
            self.down_since = now
            log.critical(
                event(
                    "store_unavailable",
                    {
                        "db": self.store.url,
                        "error": self.error,
                        "pending": self.pending,
                        "fix": outage_fix(self.error, self.store.url),
                        "guarding": "in memory: judging and stopping go on, writes are replayed when it is back",
                    },
                )
            )
        self._next_try = now + self._backoff.next_delay()

    def retry(self) -> None:
        """Replay the queue (or, with nothing queued, probe with a real write) once its backoff is over;
        the outage ends when everything got through."""
        if not self.degraded or self.clock() < self._next_try:
            return
        replayed = 0
        try:
            if not self._queue:
                self.store.probe_write()
            while self._queue:
                head = self._queue[0]
                try:
                    self._run(head)
                except Exception as exc:
                    if unavailable(exc):
                        raise
                    self._queue.popleft()
                    self._lost(head, exc, traceback=True)
                else:
                    self._queue.popleft()
                    self._committed(head)
                replayed += 1
        except Exception as exc:
            if not unavailable(exc):
                raise
            self.failed(exc)
            return
        assert self.down_since is not None
        log.warning(
            event(
                "store_recovered",
                {
                    "db": self.store.url,
                    "replayed": replayed,
                    "outage_s": round(self.clock() - self.down_since, 1),
                    "dropped": self.dropped,
                    "failed_units": self.failed_units,
                },
            )
        )
        self.down_since, self.error, self._dropped_in_outage = None, None, 0
        self._backoff.reset()

    def _committed(self, pending: _Pending) -> None:
        if pending.committed is not None:
            pending.committed()

    def _lost(self, pending: _Pending, exc: BaseException, *, traceback: bool) -> None:
        """A unit refused for a non-outage error: counted, said loudly (the error's first line only: no SQL
        parameters), and handed to its owner's ``refused`` hook."""
        self.failed_units += 1
        log.critical(
            event(
                "store_write_failed",
                {
                    "db": self.store.url,
                    "unit": pending.name,
                    "error": failure_text(exc),
                    "failed_units": self.failed_units,
                    "lost": "its writes (a bug, not an outage: the traceback names it)",
                },
            ),
            exc_info=exc if traceback else None,
        )
        if pending.refused is not None:
            pending.refused(exc)

    def _run(self, pending: _Pending) -> None:
        scope: AbstractContextManager[Store] = (
            self.store.transaction(steps_only=pending.steps_only) if pending.atomic else nullcontext(self.store)
        )
        with scope as store:
            pending.unit(store)

    def _enqueue(self, pending: _Pending) -> None:
        if len(self._queue) < self.limit:
            self._queue.append(pending)
            return
        self.dropped += 1
        self._dropped_in_outage += 1
        if self._dropped_in_outage == 1:
            log.critical(
                event(
                    "store_writes_dropped",
                    {
                        "db": self.store.url,
                        "dropped": self.dropped,
                        "limit": self.limit,
                        "unit": pending.name,
                        "kept": "the steps stay in the run's metrics files: guardian run --attach reads them again",
                    },
                )
            )
