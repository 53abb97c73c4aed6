"""``guardian incidents close ID --reason TEXT``: a person closes an incident the guardian left open (a watch or a
replay never closes its critical ones). The close is kept with the incident (status ``closed``, who, why, when),
shown by ``incidents list``, ``incidents show`` and ``guardian report``'s timeline, and the checklist no longer
counts it as open at critical."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from guardian.cli import EXIT_ERROR, EXIT_OK, main
from guardian.config import GuardianConfig
from guardian.core import Finding, Severity, StepRecord
from guardian.report.story import timeline
from guardian.review.checklist import Mark, incidents_item
from guardian.review.incidents import incident_rows
from guardian.states import IncidentStatus, Kind, RunStatus
from guardian.store import Store

NOW = 1_700_000_000.0  # opened in the past: the close is now


def _store(home: Path) -> Store:
    return Store.open(f"sqlite:///{home / 'guardian.db'}")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store with one run, its steps 1-40 and one open critical incident (#1) at step 30."""
    folder = tmp_path / "home"
    folder.mkdir()
    monkeypatch.setenv("GUARDIAN_HOME", str(folder))
    monkeypatch.delenv("GUARDIAN_DB_URL", raising=False)
    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("LOGNAME", "alice")
    with _store(folder) as store:
        store.ensure_run(
            "run-a",
            name="run-a",
            metrics_path="m.jsonl",
            rollouts_dir="",
            checkpoints_dir=None,
            mode="observe",
            now=NOW,
        )
        attempt = store.start_attempt("run-a", metrics_path="m.jsonl", now=NOW)
        store.write_steps(
            "run-a", attempt.id, 0, [StepRecord(s, {"critic/score/mean": 0.5}) for s in range(1, 41)], NOW
        )
        finding = Finding("entropy_collapse", Severity.CRITICAL, 30, "entropy fell to 2% of its baseline")
        incident = store.open_incident("run-a", finding, NOW)
        store.add_finding("run-a", attempt.id, finding, NOW, incident_id=incident.id)
    return folder


def _cli(*argv: str) -> int:
    return main(["--log-level", "ERROR", "incidents", *argv])


def test_close_keeps_who_why_and_when_and_every_view_shows_it(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli("close", "1", "--reason", "a replay of a known-bad run: nothing to rescue") == EXIT_OK
    said = capsys.readouterr().out
    assert "incident #1 closed by alice: a replay of a known-bad run: nothing to rescue" in said

    with _store(home) as store:
        detail = store.get_incident(1)
        assert detail is not None
        i = detail.incident
        assert i.status == IncidentStatus.CLOSED and not i.is_open
        assert i.note == "closed by alice: a replay of a known-bad run: nothing to rescue"
        assert i.closed_at is not None and i.closed_step == 40  # the run's newest step when it was closed
        # the report's timeline ends the incident with its closing, who and why
        rows = timeline([detail], [])
        assert rows[-1].what == "incident #1 closed by hand"
        assert rows[-1].detail == "closed by alice: a replay of a known-bad run: nothing to rescue"
        # the checklist no longer fails on it
        item = incidents_item(incident_rows(store, "run-a", None, GuardianConfig().cost))
        assert item.mark is Mark.PASS
        assert "closed by hand: #1 entropy_collapse" in item.reason

    assert _cli("list") == EXIT_OK
    listed = capsys.readouterr().out
    assert " closed " in listed.splitlines()[0]
    assert "      closed by alice: a replay of a known-bad run: nothing to rescue" in listed
    assert _cli("show", "1") == EXIT_OK
    shown = capsys.readouterr().out
    assert "status closed" in shown
    assert "  closed at step 40 - closed by alice: a replay of a known-bad run: nothing to rescue" in shown
    assert _cli("list", "--json") == EXIT_OK
    (row,) = json.loads(capsys.readouterr().out)
    assert row["status"] == "closed" and row["note"].startswith("closed by alice: ")


def test_an_unknown_or_closed_incident_is_refused_and_left_as_it_was(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cli("close", "7", "--reason", "x") == EXIT_ERROR
    assert "no incident #7" in capsys.readouterr().err
    assert _cli("close", "1", "--reason", "first") == EXIT_OK
    capsys.readouterr()
    assert _cli("close", "1", "--reason", "second") == EXIT_ERROR
    err = capsys.readouterr().err
    assert "incident #1 is already closed" in err and "closed by alice: first" in err
    with _store(home) as store:
        detail = store.get_incident(1)
        assert detail is not None and detail.incident.note == "closed by alice: first"


@pytest.mark.parametrize("reason", ["", "   "])
def test_a_close_needs_a_reason(home: Path, reason: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli("close", "1", "--reason", reason) == EXIT_ERROR
    assert "--reason" in capsys.readouterr().err
    with _store(home) as store:
        detail = store.get_incident(1)
        assert detail is not None and detail.incident.is_open


def test_the_checklist_still_fails_while_it_is_open(home: Path) -> None:
    with _store(home) as store:
        item = incidents_item(incident_rows(store, "run-a", None, GuardianConfig().cost))
    assert item.mark is Mark.FAIL and "open at critical: #1 entropy_collapse" in item.reason


def test_an_incident_under_rescue_is_refused_while_its_run_goes_on(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The rescue closes its incident when its intervention ends (over a person's close): a close now would not
    hold. Once the run is over (guardian stop), the incident may be closed."""
    with _store(home) as store:
        store.create_intervention("run-a", 1, kind=Kind.REMEDIATE, rung=0, from_attempt_id=None, now=NOW)
    assert _cli("close", "1", "--reason", "enough") == EXIT_ERROR
    err = capsys.readouterr().err
    assert "intervention 1 of incident #1 is at DETECTED" in err and "guardian stop run-a" in err
    with _store(home) as store:
        detail = store.get_incident(1)
        assert detail is not None and detail.incident.is_open
        store.set_run_status("run-a", RunStatus.FINISHED)
    assert _cli("close", "1", "--reason", "enough") == EXIT_OK
