"""The dispatcher's bookkeeping: per sink, which events were sent, suppressed, are failing or dropped.
``Store`` inherits these methods. A row is written after each delivery attempt, so a restarted guardian resumes
where the sinks left off (no repeats, no gaps) and the exporter can count failures."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from guardian.store.models import Delivery
from guardian.store.views import as_utc, at_utc

SENT: Final = "sent"
SUPPRESSED: Final = "suppressed"  # cooldown, or older than the sink's horizon when first seen
FAILING: Final = "failing"  # will be retried
DROPPED: Final = "dropped"  # retries used up, or not retried: a bug or a refusal no retry can change (guardian.faults)
DELIVERY_STATUSES: Final = (SENT, SUPPRESSED, FAILING, DROPPED)
_ERROR_CHARS: Final = 500


@dataclass(frozen=True, slots=True)
class DeliveryView:
    sink: str
    event_key: str
    check: str
    level: int
    status: str
    attempts: int
    updated_at: datetime
    external_id: str | None
    last_error: str | None

    def to_json(self) -> dict[str, object]:
        return {
            "sink": self.sink,
            "event": self.event_key,
            "status": self.status,
            "attempts": self.attempts,
            "at": self.updated_at.isoformat(),
            "error": self.last_error,
        }


def _view(r: Delivery) -> DeliveryView:
    return DeliveryView(
        r.sink, r.event_key, r.check, r.level, r.status, r.attempts, as_utc(r.updated_at), r.external_id, r.last_error
    )


class DeliveryRecords:
    """Delivery methods of ``Store`` (needs the store's read and write session factories)."""

    _read: sessionmaker[Session]
    _write: sessionmaker[Session]

    def deliveries(self, run_id: str, sink: str | None = None) -> dict[str, DeliveryView]:
        """The delivery rows of ``run_id`` (of one ``sink``: by event key; of every sink: by ``sink/key``)."""
        query = select(Delivery).where(Delivery.run_id == run_id).order_by(Delivery.id)
        if sink is not None:
            query = query.where(Delivery.sink == sink)
        with self._read() as session:
            views = [_view(r) for r in session.scalars(query)]
        return {(v.event_key if sink is not None else f"{v.sink}/{v.event_key}"): v for v in views}

    def record_delivery(
        self,
        run_id: str,
        sink: str,
        event_key: str,
        *,
        check: str,
        level: int,
        status: str,
        now: float,
        external_id: str | None = None,
        error: str | None = None,
    ) -> None:
        """Insert or update the row of (run, sink, event); every call counts one more attempt."""
        if status not in DELIVERY_STATUSES:
            raise ValueError(f"unknown delivery status {status!r} (expected one of {DELIVERY_STATUSES})")
        with self._write.begin() as session:
            row = session.scalar(
                select(Delivery).where(
                    Delivery.run_id == run_id, Delivery.sink == sink, Delivery.event_key == event_key
                )
            )
            if row is None:
                row = Delivery(run_id=run_id, sink=sink, event_key=event_key, attempts=0)
                session.add(row)
            row.check, row.level, row.status = check, level, status
            row.attempts += 1
            row.updated_at = at_utc(now)
            row.external_id = external_id if external_id is not None else row.external_id
            row.last_error = error[:_ERROR_CHARS] if error is not None else None

    def delivery_counts(self, run_id: str) -> dict[tuple[str, str], int]:
        """Events per (sink, status) of ``run_id`` (the exporter's notification counter)."""
        with self._read() as session:
            rows = session.execute(
                select(Delivery.sink, Delivery.status, func.count())
                .where(Delivery.run_id == run_id)
                .group_by(Delivery.sink, Delivery.status)
            )
            return dict(Counter({(sink, status): int(n) for sink, status, n in rows}))
