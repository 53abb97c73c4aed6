"""``guardian incidents show``: the text view over what a real ``guardian demo`` stored, and over a real
SQLite store built by hand (incidents before the first step, interventions numbered per run)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from guardian.checks.findings import Finding, Severity
from guardian.cli import EXIT_OK, main
from guardian.cli.incidents import stages
from guardian.store import InterventionEventView, Store

RESCUE_STATES = ("DETECTED", "STOPPING", "STOPPED", "ROLLED_BACK", "PATCHED", "RESUMING", "PROBATION", "RESOLVED")
NOW = 1_800_000_000.0


def _show(home: Path, incident: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    monkeypatch.setenv("GUARDIAN_HOME", str(home))
    monkeypatch.delenv("GUARDIAN_DB_URL", raising=False)
    assert main(["--log-level", "ERROR", "incidents", "show", str(incident)]) == EXIT_OK
    return capsys.readouterr().out


# ------------------------------------------------------------------------------------------ a real demo


@pytest.fixture(scope="module")
def demo_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("demo-home")
    env = {**os.environ, "GUARDIAN_HOME": str(home)}
    env.pop("GUARDIAN_DB_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "guardian", "--log-level", "ERROR", "demo"],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return home


@pytest.mark.slow
def test_show_tells_the_rescue_once_with_target_and_patch(
    demo_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GUARDIAN_HOME", str(demo_home))
    assert main(["--log-level", "ERROR", "incidents", "show", "1", "--json"]) == EXIT_OK
    stored = json.loads(capsys.readouterr().out)
    iv = stored["interventions"][0]
    assert (iv["number"], iv["rung"]) == (1, 0)  # JSON keeps the stored values
    text = _show(demo_home, 1, monkeypatch, capsys)

    timeline = [line.split()[2] for line in text.splitlines() if re.match(r"\s+\d{4}-\d\d-\d\d \d\d:", line)]
    assert timeline == list(RESCUE_STATES)  # each state once, STOPPED included
    assert "intervention 1 of incident #1 (remediate, rung 1): RESOLVED" in text
    assert "rung 0" not in text and "None" not in text
    assert f"rollback target: checkpoint of step {iv['target_step']} ({iv['target_path']})" in text
    for row in iv["plan"]["diff"]:
        before = "unset" if row["before"] is None else row["before"]
        assert f"{row['key']}: {before} -> {row['after']}" in text
    assert "actor_rollout_ref.actor.entropy_coeff: -0.3 -> 0.003" in text
    assert "figures: critic/score/mean" in text
    assert "told log: intervention 1 of incident #1 STOPPED sent" in text
    assert re.search(r"reward_improving = (true|false)\n", text)


# ------------------------------------------------------------------------------------------ a store by hand


def _incident(store: Store, run_id: str, step: int | None) -> int:
    store.ensure_run(
        run_id, name=run_id, metrics_path="m.jsonl", rollouts_dir="", checkpoints_dir=None, mode="enforce", now=NOW
    )
    finding = Finding("stall", Severity.CRITICAL, step, "no step yet", evidence={"waited_s": 12.5, "started": False})
    incident = store.open_incident(run_id, finding, NOW)
    store.add_finding(run_id, None, finding, NOW, incident_id=incident.id)
    return incident.id


def test_numbering_and_a_step_before_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    with Store.open(f"sqlite:///{home / 'guardian.db'}") as store:
        _incident(store, "run-a", 3)
        first = store.create_intervention("run-a", 1, kind="restart", rung=0, from_attempt_id=None, now=NOW)
        second_incident = _incident(store, "run-b", None)
        iv = store.create_intervention(
            "run-b", second_incident, kind="remediate", rung=1, from_attempt_id=None, now=NOW
        )
        store.advance(iv.id, "STOPPING", now=NOW, detail={"plan": "rung 2 of 3"})
        store.advance(iv.id, "STOPPED", now=NOW)
        store.advance(iv.id, "STOPPED", now=NOW, detail={"target": None})
        store.advance(
            iv.id,
            "ROLLED_BACK",
            now=NOW,
            detail={"target": None, "why": "no healthy checkpoint before the onset", "moved": [5]},
        )
    assert (first.id, iv.id, iv.number) == (1, 2, 1)  # the id and the per-run number differ

    text = _show(home, second_incident, monkeypatch, capsys)
    assert "intervention 1 of incident #2 (remediate, rung 2): ROLLED_BACK" in text
    assert "intervention 2" not in text
    assert "opened before the first step" in text and "None" not in text
    assert "started = false" in text and "waited_s = 12.5" in text
    assert "rollback target: none, from scratch - no healthy checkpoint before the onset" in text
    assert "quarantined checkpoints: 5" in text
    assert text.count(" STOPPED") == 1

    monkeypatch.setenv("GUARDIAN_HOME", str(home))
    assert main(["incidents", "list"]) == EXIT_OK
    listed = capsys.readouterr().out
    assert "before the first step" in listed and "step None" not in listed and "onset None" not in listed


def test_booleans_stay_booleans_in_the_store_and_its_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    with Store.open(f"sqlite:///{home / 'guardian.db'}") as store:
        incident = _incident(store, "run-a", 7)
    monkeypatch.setenv("GUARDIAN_HOME", str(home))
    assert main(["incidents", "show", str(incident), "--json"]) == EXIT_OK
    shown = json.loads(capsys.readouterr().out)
    assert shown["evidence"]["started"] is False
    assert shown["findings"][0]["evidence"]["started"] is False


def test_stages_merge_a_state_committed_twice() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    merged = stages(
        [
            InterventionEventView(1, "DETECTED", at, {}),
            InterventionEventView(2, "STOPPED", at, {"why": "first"}),
            InterventionEventView(3, "STOPPED", at, {"target": "/ckpt/global_step_5", "why": "newest healthy"}),
            InterventionEventView(4, "ROLLED_BACK", at, {"moved": [10]}),
        ]
    )
    assert [s.state for s in merged] == ["DETECTED", "STOPPED", "ROLLED_BACK"]
    assert merged[1].detail == {"target": "/ckpt/global_step_5", "why": "newest healthy"}
