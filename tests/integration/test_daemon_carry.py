"""Lines the guard loop has read are judged even when the tick that read them failed on the store."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from guardian.config import GuardianConfig
from guardian.incidents.tick import IncidentTick
from guardian.sources.jsonl import MetricsFile
from guardian.store import Store


def test_a_watch_whose_first_tick_meets_a_locked_store_judges_those_lines_on_the_next(tmp_path: Path) -> None:
    metrics, db = tmp_path / "metrics.jsonl", tmp_path / "guardian.db"
    metrics.write_text("".join(json.dumps({"step": s, "data": {"actor/entropy": 1.0}}) + "\n" for s in range(1, 9)))
    with Store.open(f"sqlite:///{db}", busy_timeout_s=0.1) as store:
        store.ensure_run(
            "w", name="w", metrics_path=str(metrics), rollouts_dir="", checkpoints_dir=None, mode="observe", now=0.0
        )
        guardian = IncidentTick(
            config=GuardianConfig(), store=store, run_id="w", metrics=MetricsFile(metrics), clock=lambda: 1.0
        )
        holder = sqlite3.connect(db, timeout=0.1)
        holder.execute("BEGIN EXCLUSIVE")  # another writer holds the database: the attempt cannot begin
        try:
            with pytest.raises(OperationalError, match="locked"):
                guardian.tick()
        finally:
            holder.rollback()
            holder.close()
        result = guardian.tick()  # the file has nothing new: the eight lines come from the failed tick
        assert result.new_steps == 8 and guardian.history.steps == list(range(1, 9))
        stored = store.latest_step("w")
    assert stored is not None and stored[0] == 8
