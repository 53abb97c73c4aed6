"""Deliver the store's events to sinks (notifiers, Grafana) from a background thread.

Invariants: nothing a sink does can delay the guard loop; each (sink, event) has one ``deliveries`` row (sent,
suppressed, failing, dropped). An outage is retried with backoff, a bug dropped at once (``event=delivery_bug``).
``decide`` (pure) applies routing by level, the ``max_age_s`` horizon and the per-check cooldown.
Why an outbox: docs/decisions/0055-notifications-from-the-store.md."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from guardian.backoff import doubling
from guardian.config import STORE_REREAD_S
from guardian.faults import fault_fields, is_outage
from guardian.logs import event, get_logger
from guardian.notify.compose import Alert
from guardian.notify.events import EventKind, GuardianEvent, is_incident_alert, load_events, opening_keys
from guardian.store import Store
from guardian.store.changes import StoreMemo
from guardian.store.deliveries import DROPPED, FAILING, SENT, SUPPRESSED, DeliveryView

log = get_logger("notify")

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0


class Sink(Protocol):
    """Where events go. ``deliver`` raises on failure (any exception; the message must hold no secret:
    an outage is retried, anything else dropped, see ``guardian.faults``) and returns an id the sink may
    need later (a Grafana annotation id), or None."""

    @property
    def name(self) -> str: ...

    @property
    def cooldown_s(self) -> float:
        """Per-check cooldown of incident alerts (0: none)."""
        ...

    def wants(self, event: GuardianEvent) -> bool: ...

    def deliver(self, event: GuardianEvent, earlier: Mapping[str, DeliveryView]) -> str | None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class DispatchPolicy:
    max_age_s: float = 3600.0
    retries: int = 60
    interval_s: float = 1.0
    reread_s: float = STORE_REREAD_S  # store.reread_s: the events and deliveries read are kept this long at most


class Decision(StrEnum):
    SEND = "send"
    SKIP = "skip"  # not for this sink, already handled, or a retry not yet due
    STALE = "stale"
    COOLDOWN = "cooldown"


def backoff_s(attempts: int) -> float:
    """Seconds before retry number ``attempts`` (1, 2, 4 ... capped at ``MAX_BACKOFF_S``)."""
    return doubling(attempts, FIRST_BACKOFF_S, MAX_BACKOFF_S)


def decide(
    event: GuardianEvent,
    sink: Sink,
    earlier: Mapping[str, DeliveryView],
    now: float,
    policy: DispatchPolicy,
) -> Decision:
    """What to do with ``event`` for ``sink`` now, given the sink's ``earlier`` deliveries of the run."""
    if not sink.wants(event):
        return Decision.SKIP
    past = earlier.get(event.key)
    if past is not None:
        if past.status != FAILING:
            return Decision.SKIP
        due = past.updated_at.timestamp() + backoff_s(past.attempts)
        return Decision.SEND if now >= due else Decision.SKIP
    if now - event.last_change.timestamp() > policy.max_age_s:
        return Decision.STALE
    if event.kind is EventKind.INCIDENT_CLOSED and any(
        earlier[k].status == FAILING for k in opening_keys(event.incident.id, earlier)
    ):
        return Decision.SKIP  # the closing waits for its opening (a Grafana region needs the opening's id)
    if event.kind is EventKind.INCIDENT and sink.cooldown_s > 0:
        for other in earlier.values():
            if (
                other.status == SENT
                and other.check == event.check
                and is_incident_alert(other.event_key)
                and other.level >= int(event.level)
                and now - other.updated_at.timestamp() < sink.cooldown_s
            ):
                return Decision.COOLDOWN
    return Decision.SEND


class Dispatcher:
    """Delivers one run's events to its sinks; ``pass_once`` is one sweep (tests call it directly)."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        sinks: Sequence[Sink],
        policy: DispatchPolicy,
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.sinks = list(sinks)
        self.policy = policy
        self.clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # sent, but the store refused the bookkeeping (busy): recorded before anything else is sent,
        # so a busy store never makes an event go out twice
        self._unrecorded: dict[tuple[str, str], tuple[GuardianEvent, float, str | None]] = {}
        self._bugs_told: set[tuple[str, str | None, str, str]] = set()  # see ``_trouble``
        # the events and deliveries read, kept while nothing was written (a quiet run's sweeps read nothing)
        self._reads = StoreMemo(store.writes, policy.reread_s, clock)

    def announce(self, alert: Alert) -> None:
        """Send ``alert`` at once, straight to every notifier that takes its level, bypassing the store: for
        what must reach a person when the store itself is the trouble (the guardian cannot continue). Best
        effort, in the caller's thread, each notifier bounded by its own timeout; never raises."""
        for sink in self.sinks:
            announce = getattr(sink, "announce", None)
            if announce is None:
                continue
            try:
                announce(alert)
            except Exception as exc:  # the log line below is the last resort: it names what failed
                said, trace = _told(exc)
                log.error(event("announce_failed", {"run": self.run_id, "sink": sink.name, **said}), exc_info=trace)

    def pass_once(self) -> int:
        """Deliver every due event; returns how many delivery attempts were made. Never raises."""
        try:
            events = self._reads.read("events", lambda: load_events(self.store, self.run_id))
        except Exception as exc:  # the store is busy: try again next sweep
            self._trouble(exc, "notify_read_failed", "notify_read_bug", None)
            return 0
        attempts = 0
        for sink in self.sinks:
            try:
                attempts += self._sweep(sink, events)
            except Exception as exc:  # a bookkeeping failure must not stop the other sinks
                self._trouble(exc, "notify_sweep_failed", "notify_sweep_bug", sink.name)
        return attempts

    def _trouble(self, exc: Exception, outage: str, bug: str, sink: str | None) -> None:
        """A sweep, or its read of the store, failed. An outage (the store busy) passes: a warning each time,
        the next sweep tries again. A bug fails every sweep alike (once a second): an error with its
        traceback, once per place."""
        said, trace = _told(exc)
        if trace is None:
            log.warning(event(outage, {"run": self.run_id, "sink": sink, **said}))
            return
        told = (bug, sink, said["type"], said["at"])
        if told not in self._bugs_told:
            self._bugs_told.add(told)
            log.error(event(bug, {"run": self.run_id, "sink": sink, **said}), exc_info=trace)

    def _sweep(self, sink: Sink, events: Sequence[GuardianEvent]) -> int:
        for (name, key), (ev, sent_at, external_id) in list(self._unrecorded.items()):
            if name == sink.name:
                self._record(sink, ev, SENT, sent_at, external_id=external_id)
                del self._unrecorded[name, key]

        def delivered() -> Mapping[str, DeliveryView]:
            return self._reads.read(("deliveries", sink.name), lambda: self.store.deliveries(self.run_id, sink.name))

        earlier = delivered()
        attempts = 0
        for ev in events:
            now = self.clock()
            decision = decide(ev, sink, earlier, now, self.policy)
            if decision is Decision.SKIP:
                continue
            if decision is not Decision.SEND:
                self._record(sink, ev, SUPPRESSED, now, error=decision.value)
                log.info(
                    event("alert_suppressed", {"run": self.run_id, "sink": sink.name, "event": ev.key, "why": decision})
                )
            else:
                attempts += 1
                self._send(sink, ev, earlier, now)
            earlier = delivered()
        return attempts

    def _send(self, sink: Sink, ev: GuardianEvent, earlier: Mapping[str, DeliveryView], now: float) -> None:
        try:
            external_id = sink.deliver(ev, earlier)
        except Exception as exc:
            self._failed(sink, ev, earlier, now, exc)
            return
        try:
            self._record(sink, ev, SENT, now, external_id=external_id)
        except Exception:
            self._unrecorded[sink.name, ev.key] = (ev, now, external_id)
            raise

    def _failed(
        self, sink: Sink, ev: GuardianEvent, earlier: Mapping[str, DeliveryView], now: float, exc: Exception
    ) -> None:
        """Book a failed delivery: an outage is retried (``FAILING``) until the retries are used up; a bug is
        ``DROPPED`` at once, since every retry would fail alike (the module docstring)."""
        past = earlier.get(ev.key)
        tries = (past.attempts if past is not None else 0) + 1
        said, trace = _told(exc)
        fields = {"run": self.run_id, "sink": sink.name, "event": ev.key, "attempt": tries, **said}
        if trace is not None:
            # logged before the bookkeeping: should the store refuse it, the traceback is not lost
            log.error(event("delivery_bug", fields), exc_info=trace)
            why = f"not retried (a bug, or a refusal no retry can change): {said['type']} at {said['at']}: {exc}"
            self._record(sink, ev, DROPPED, now, error=why)
            return
        status = DROPPED if tries > self.policy.retries else FAILING
        self._record(sink, ev, status, now, error=f"{type(exc).__name__}: {exc}")
        if status == DROPPED:
            log.error(event("alert_dropped", fields))
        else:
            log.warning(event("alert_failed", {**fields, "retry_in_s": backoff_s(tries)}))

    def _record(
        self,
        sink: Sink,
        ev: GuardianEvent,
        status: str,
        now: float,
        *,
        external_id: str | None = None,
        error: str | None = None,
    ) -> None:
        self.store.record_delivery(
            self.run_id,
            sink.name,
            ev.key,
            check=ev.check,
            level=int(ev.level),
            status=status,
            now=now,
            external_id=external_id,
            error=error,
        )

    # ---------------------------------------------------------------------------------- thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"guardian-notify-{self.run_id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.pass_once()
            self._stop.wait(self.policy.interval_s)
        self.pass_once()  # the last events (a gave-up, a resolution) still go out

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop after one last sweep; waits at most ``timeout_s`` (a hung sink is left behind, logged)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():  # a sink hangs: closing it could block on the same call
                log.warning(event("notify_flush_timeout", {"run": self.run_id, "after_s": timeout_s}))
                return
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:
                said, trace = _told(exc)
                log.warning(event("notify_close_failed", {"sink": sink.name, **said}), exc_info=trace)


def _told(exc: Exception) -> tuple[dict[str, str], Exception | None]:
    """What a log line says of a failure, and the traceback it carries: an outage its message only (it
    passes); a bug its type, place and traceback (``fault_fields``: a developer has to find it)."""
    if is_outage(exc):
        return {"detail": str(exc)}, None
    return fault_fields(exc), exc


@contextmanager
def dispatching(dispatcher: Dispatcher | None) -> Iterator[None]:
    """Run ``dispatcher`` in the background for the duration of the block (None: nothing to do)."""
    if dispatcher is None:
        yield
        return
    dispatcher.start()
    try:
        yield
    finally:
        dispatcher.stop()
