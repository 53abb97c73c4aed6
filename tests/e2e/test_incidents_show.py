"""``guardian incidents show``: the text view over what a real ``guardian demo`` stored (conftest's ``demo_home``),
and over a real SQLite store built by hand (incidents before the first step, interventions numbered per run)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from guardian.cli import EXIT_OK, EXIT_USAGE, main
from guardian.cli.incidents import stages
from guardian.core import Finding, Severity
from guardian.store import InterventionEventView, Store

RESCUE_STATES = ("DETECTED", "STOPPING", "STOPPED", "ROLLED_BACK", "PATCHED", "RESUMING", "PROBATION", "RESOLVED")
NOW = 1_800_000_000.0


def _show(home: Path, incident: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    monkeypatch.setenv("GUARDIAN_HOME", str(home))
    monkeypatch.delenv("GUARDIAN_DB_URL", raising=False)
    assert main(["--log-level", "ERROR", "incidents", "show", str(incident)]) == EXIT_OK
    return capsys.readouterr().out


# ------------------------------------------------------------------------------------------ a real demo


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
    assert re.search(r"progress = .+\n", text)
    # what the rollback threw away, and which attempt resumed from where
    assert f"lost: {stored['cost']['steps_lost']} steps (steps {iv['target_step'] + 1}-" in text
    assert "GPU-hours ($" in text and "× 8 GPUs (verl defaults)" in text
    assert "    attempt 1: " in text and " + 11 override(s)" in text
    assert (
        f"    attempt 2 <- intervention 1 of incident #1 (remediate, entropy-1) after attempt 1: resumed from step "
        f"{iv['target_step']}, patch actor_rollout_ref.actor.entropy_coeff: -0.3 -> 0.003" in text
    )


def _steps(path: Path) -> dict[int, dict[str, float | None]]:
    """A verl file-logger JSONL as step -> values (lines of one step merged, later values winning)."""
    steps: dict[int, dict[str, float | None]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            steps.setdefault(record["step"], {}).update(record["data"])
    return steps


@pytest.mark.slow
def test_show_prices_the_steps_the_rollback_threw_away_from_the_trainer_files(
    demo_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GUARDIAN_HOME", str(demo_home))
    assert main(["--log-level", "ERROR", "incidents", "show", "1", "--json"]) == EXIT_OK
    stored = json.loads(capsys.readouterr().out)
    iv, target = stored["interventions"][0], stored["interventions"][0]["target_step"]
    (run_folder,) = (demo_home / "runs").iterdir()
    first, second = (_steps(run_folder / f"attempt-{n}" / "metrics.jsonl") for n in (1, 2))

    lineage = stored["lineage"]
    # what attempt 1 logged after the checkpoint it fell back to, up to the last line the guardian read before it
    # stopped the trainer (the trainer may log a line or two more while it stops: not counted, a floor)
    logged = sorted(s for s in first if s > target)
    abandoned = [s for s in logged if s <= lineage[0]["last_step"]]
    assert stored["cost"]["steps_lost"] == len(abandoned) and abandoned and len(logged) - len(abandoned) <= 3
    assert stored["cost"]["discards"] == [
        {
            "intervention_id": iv["id"],
            "intervention_number": 1,
            "target_step": target,
            "steps": len(abandoned),
            "first_step": abandoned[0],
            "last_step": abandoned[-1],
        }
    ]
    # the run's timeline: attempt 2 whole, attempt 1 before attempt 2's first step; its median step time
    timeline = {**{s: v for s, v in first.items() if s < min(second)}, **second}
    times = sorted(v["timing_s/step"] for v in timeline.values() if v.get("timing_s/step"))
    median = (times[len(times) // 2] + times[(len(times) - 1) // 2]) / 2
    rate = stored["cost"]["rate"]
    assert rate == {"step_seconds": round(median, 3), "gpus": 8, "gpus_source": "verl defaults",
                    "gpu_hour_usd": 12.25, "unknown": None}  # fmt: skip
    assert stored["cost"]["gpu_hours"] == round(len(abandoned) * median * 8 / 3600, 3)

    assert [a["number"] for a in lineage] == [1, 2]
    assert lineage[0]["launched_by"] is None and lineage[0]["resumed_from_step"] is None
    assert lineage[0]["first_step"] == min(first)
    assert lineage[1]["launched_by"]["rung_name"] == "entropy-1" and lineage[1]["launched_by"]["from_attempt"] == 1
    assert lineage[1]["resumed_from_step"] == target and lineage[1]["resumed_from_path"] == iv["target_path"]
    assert (lineage[1]["first_step"], lineage[1]["last_step"]) == (min(second), max(second))
    assert lineage[1]["exit_code"] == 0 and lineage[1]["patch"] == iv["plan"]["diff"]


@pytest.mark.slow
def test_list_tells_action_outcome_and_loss_and_filters_by_date(
    demo_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GUARDIAN_HOME", str(demo_home))
    assert main(["--log-level", "ERROR", "incidents", "list", "--json"]) == EXIT_OK
    (row,) = json.loads(capsys.readouterr().out)
    assert row["action"] == {
        "kind": "remediate",
        "rung": 0,
        "rung_name": "entropy-1",
        "intervention_number": 1,
        "state": "RESOLVED",
    }
    assert row["final_state"] == "RESOLVED" and row["outcome"]["reward"]["recovered"] is True
    assert row["steps_lost"] > 0 and row["gpu_hours_lost"] > 0

    assert main(["--log-level", "ERROR", "incidents", "list"]) == EXIT_OK
    text = capsys.readouterr().out
    assert f"#1    {row['run_id']}" in text and "entropy_collapse" in text
    assert f"detected at step {row['opened_step']} (onset step {row['onset_step']})" in text
    assert "remediate entropy-1 (rung 1)" in text and "RESOLVED" in text
    assert f"{row['steps_lost']} steps, " in text and " GPU-h lost" in text
    assert f"      outcome: {row['outcome_line']}" in text
    assert "by hand (700 steps late each) at least 700 steps" in text

    opened = datetime.fromisoformat(row["opened_at"])
    assert main(["incidents", "list", "--json", "--since", f"{opened:%Y-%m-%d}"]) == EXIT_OK
    assert len(json.loads(capsys.readouterr().out)) == 1
    later = (opened.replace(microsecond=0) + timedelta(seconds=1)).isoformat()
    assert main(["incidents", "list", "--json", "--since", later]) == EXIT_OK
    assert json.loads(capsys.readouterr().out) == []


def test_since_must_be_an_iso_date(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["incidents", "list", "--since", "last tuesday"])
    assert exited.value.code == EXIT_USAGE
    assert "--since: expected an ISO date or date-time such as 2026-12-01" in capsys.readouterr().err


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
