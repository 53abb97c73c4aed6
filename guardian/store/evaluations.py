"""Evaluation results people record for a run (``guardian checklist --eval name=value``). ``Store`` inherits
these methods; the checklist judges the newest value of each name against ``checklist.eval_minimums``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from guardian.store.errors import NotFoundError
from guardian.store.models import Evaluation, Run
from guardian.store.views import as_utc, at_utc

EVAL_NAME_MAX = 128  # the column's width


@dataclass(frozen=True, slots=True)
class EvaluationView:
    name: str
    value: float
    step: int | None
    recorded_at: datetime

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "value": self.value, "step": self.step, "recorded_at": self.recorded_at.isoformat()}


def _view(row: Evaluation) -> EvaluationView:
    return EvaluationView(row.name, row.value, row.step, as_utc(row.recorded_at))


class EvaluationRecords:
    """Evaluation methods of ``Store`` (needs the store's read and write session factories)."""

    _read: sessionmaker[Session]
    _write: sessionmaker[Session]

    def record_evaluations(
        self, run_id: str, results: Mapping[str, float], *, step: int | None, now: float
    ) -> list[EvaluationView]:
        """Store each result (finite values, names up to ``EVAL_NAME_MAX`` characters) in one transaction."""
        for name, value in results.items():
            if not name or len(name) > EVAL_NAME_MAX or not math.isfinite(value):
                why = f"needs a name of 1-{EVAL_NAME_MAX} characters and a finite value"
                raise ValueError(f"evaluation {name!r}={value}: {why}")
        with self._write() as session, session.begin():
            if session.get(Run, run_id) is None:
                raise NotFoundError(f"no run {run_id!r}")
            rows = [
                Evaluation(run_id=run_id, name=name, value=value, step=step, recorded_at=at_utc(now))
                for name, value in results.items()
            ]
            session.add_all(rows)
            session.flush()
            return [_view(r) for r in rows]

    def evaluations(self, run_id: str) -> list[EvaluationView]:
        """The run's recorded evaluations, oldest first."""
        with self._read() as session:
            rows = session.scalars(
                select(Evaluation).where(Evaluation.run_id == run_id).order_by(Evaluation.recorded_at, Evaluation.id)
            )
            return [_view(r) for r in rows]
