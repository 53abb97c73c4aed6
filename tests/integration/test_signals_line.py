"""The run's ``event=signals`` line, from a real guardian reading a real metrics file: a step 0 that holds only
verl's validation metrics (its default ``val_before_train``) is not "every training signal missing"; the line is
said again, right, once the first training step arrives."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from guardian.config import GuardianConfig
from guardian.incidents.tick import IncidentTick
from guardian.sources.jsonl import MetricsFile
from guardian.store import Store

VALIDATION = {"val-core/gsm8k/reward/mean@1": 0.31}
TRAINING = {"actor/entropy": 1.2, "critic/score/mean": 0.3, "actor/kl_loss": 0.001, "actor/grad_norm": 0.5}


def signals_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("event=signals")]


def test_a_validation_only_step_0_is_no_missing_training_signals_and_the_line_is_corrected(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 0, "data": VALIDATION}) + "\n")
    caplog.set_level(logging.INFO)
    with Store.open(f"sqlite:///{tmp_path / 'guardian.db'}") as store:
        store.ensure_run(
            "v", name="v", metrics_path=str(metrics), rollouts_dir="", checkpoints_dir=None, mode="observe", now=0.0
        )
        guardian = IncidentTick(
            config=GuardianConfig(), store=store, run_id="v", metrics=MetricsFile(metrics), clock=lambda: 1.0
        )
        guardian.tick()
        first = signals_lines(caplog)
        assert len(first) == 1, first
        assert "missing=" not in first[0] and "training=" in first[0] and "val_score=" in first[0]

        with metrics.open("a") as out:
            out.write(json.dumps({"step": 1, "data": TRAINING}) + "\n")
        guardian.tick()
        guardian.tick()  # nothing new: nothing said
        lines = signals_lines(caplog)
        assert len(lines) == 2, lines
        corrected = lines[1]
        assert "entropy=actor/entropy" in corrected and "reward=critic/score/mean" in corrected
        missing = corrected.split("missing=", 1)[1].split()[0].split(",")
        assert "entropy" not in missing and "reward" not in missing and "log_ppl" in missing
        assert "since_step=1" in corrected


def test_a_run_whose_first_step_trains_says_the_line_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "data": TRAINING}) + "\n" for s in (1, 2, 3)))
    caplog.set_level(logging.INFO)
    with Store.open(f"sqlite:///{tmp_path / 'guardian.db'}") as store:
        store.ensure_run(
            "t", name="t", metrics_path=str(metrics), rollouts_dir="", checkpoints_dir=None, mode="observe", now=0.0
        )
        guardian = IncidentTick(
            config=GuardianConfig(), store=store, run_id="t", metrics=MetricsFile(metrics), clock=lambda: 1.0
        )
        for _ in range(3):
            guardian.tick()
    lines = signals_lines(caplog)
    assert len(lines) == 1 and "missing=" in lines[0] and "since_step" not in lines[0], lines
