"""The pins' bookkeeping: which healthy checkpoints the guardian keeps under ``<ckpt>/.guardian-pinned/``.

``Store`` inherits these methods. A row is written once the pinned folder is in place (``record_pin``) and
marked released once it is gone (``release_pin``), so the store may lag the disk by one crash, never lead it:
the pin pass (``guardian.checkpoints.pinner``) adopts a pinned folder the store does not know and releases a row
whose folder is gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from guardian.states import PinMode
from guardian.store.errors import NotFoundError
from guardian.store.models import Pin
from guardian.store.views import as_utc, at_utc


@dataclass(frozen=True, slots=True)
class PinView:
    """One pin: the checkpoint folder it keeps, its pinned copy, and what that copy adds on disk."""

    id: int
    run_id: str
    step: int
    source_path: str
    pinned_path: str
    mode: PinMode
    bytes_added: int  # 0 for hard links (while the original exists), the size for a copy
    pinned_at: datetime
    released_at: datetime | None
    note: str | None

    @property
    def live(self) -> bool:
        return self.released_at is None

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "step": self.step,
            "source_path": self.source_path,
            "pinned_path": self.pinned_path,
            "mode": self.mode.value,
            "bytes_added": self.bytes_added,
            "pinned_at": self.pinned_at.isoformat(),
            "released_at": self.released_at.isoformat() if self.released_at is not None else None,
            "note": self.note,
        }


def _view(r: Pin) -> PinView:
    released = as_utc(r.released_at) if r.released_at is not None else None
    return PinView(
        r.id,
        r.run_id,
        r.step,
        r.source_path,
        r.pinned_path,
        PinMode(r.mode),
        r.bytes_added,
        as_utc(r.pinned_at),
        released,
        r.note,
    )


class PinRecords:
    """Pin methods of ``Store`` (needs the store's read and write session factories)."""

    _read: sessionmaker[Session]
    _write: sessionmaker[Session]

    def record_pin(
        self,
        run_id: str,
        *,
        step: int,
        source_path: str,
        pinned_path: str,
        mode: PinMode,
        bytes_added: int,
        now: float,
    ) -> PinView:
        """Record a pinned folder that is in place."""
        with self._write.begin() as session:
            row = Pin(
                run_id=run_id,
                step=step,
                source_path=source_path,
                pinned_path=pinned_path,
                mode=PinMode(mode).value,
                bytes_added=bytes_added,
                pinned_at=at_utc(now),
            )
            session.add(row)
            session.flush()
            return _view(row)

    def release_pin(self, pin_id: int, *, now: float, note: str) -> PinView:
        """Mark a pin released (its folder is gone); releasing one already released keeps its first release."""
        with self._write.begin() as session:
            row = session.get(Pin, pin_id)
            if row is None:
                raise NotFoundError(f"no pin {pin_id}")
            if row.released_at is None:
                row.released_at, row.note = at_utc(now), note
            return _view(row)

    def pins(self, run_id: str, *, live: bool = False) -> list[PinView]:
        """The run's pins by step, oldest first (``live``: only those not released)."""
        query = select(Pin).where(Pin.run_id == run_id).order_by(Pin.step, Pin.id)
        if live:
            query = query.where(Pin.released_at.is_(None))
        with self._read() as session:
            return [_view(r) for r in session.scalars(query)]
