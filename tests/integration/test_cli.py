"""The command line, end to end in-process (replay, config errors, incidents, doctor)."""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

import pytest
from conftest import fixture_path

from guardian.cli import EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE, main
from guardian.store import Store


@pytest.fixture(autouse=True)
def guardian_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GUARDIAN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GUARDIAN_DB_URL", raising=False)
    return tmp_path / "home"


def test_replay_json_unhealthy_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["replay", str(fixture_path("traces", "aopd-2.jsonl")), "--json"])
    assert code == EXIT_UNHEALTHY
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) >= {"run", "steps", "signals", "findings", "verdict"}
    assert doc["verdict"] == "unhealthy"
    first_critical = next(f for f in doc["findings"] if f["severity"] == "critical")
    assert set(first_critical) >= {"check", "severity", "step", "onset_step", "evidence"}


def test_replay_healthy_exit_0_and_seed_rules(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(fixture_path("traces", "aopd-4.jsonl"))]) == EXIT_OK
    assert "HEALTHY" in capsys.readouterr().out
    # the seed rules miss the length collapse of aopd-2 (no length rule)
    assert main(["replay", str(fixture_path("traces", "aopd-2.jsonl")), "--rules", "seed", "--json"]) == EXIT_OK


def test_replay_missing_file_is_an_error() -> None:
    assert main(["replay", "/nonexistent/metrics.jsonl"]) == 1


def test_bad_config_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "guardian.yaml"
    cfg.write_text("checks:\n  entropy_collapse:\n    warn_ratio: 7\n  kl_drfit: {}\n")
    assert main(["--log-level", "ERROR", "config", "--config", str(cfg)]) == EXIT_USAGE
    text = capsys.readouterr().err
    assert "checks.entropy_collapse.warn_ratio" in text
    assert "checks.kl_drfit: unknown key" in text


def test_config_example_is_the_committed_doc(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--example"]) == EXIT_OK
    committed = Path(__file__).resolve().parents[2] / "docs" / "guardian.example.yaml"
    assert capsys.readouterr().out == committed.read_text(), "run: guardian config --example > docs/..."


def test_watch_a_finished_log_then_incidents(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "metrics.jsonl"
    trace.write_bytes(files("guardian.data").joinpath("aopd-2.jsonl").read_bytes())
    assert main(["watch", "--metrics", str(trace), "--no-live", "--max-ticks", "3"]) == EXIT_UNHEALTHY
    capsys.readouterr()  # the watch's own lines
    assert main(["incidents", "list", "--json"]) == EXIT_OK
    listed = json.loads(capsys.readouterr().out)
    incident = next(i for i in listed if i["check"] == "length_collapse")
    assert main(["incidents", "show", str(incident["id"]), "--json"]) == EXIT_OK
    shown = json.loads(capsys.readouterr().out)
    assert shown["onset_step"] is not None and shown["findings"]
    assert shown["evidence"]["length_baseline"] > 500
    assert main(["incidents", "show", "9999"]) == 1


def test_doctor_reports_store_and_optional_tools(guardian_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Store.open(f"sqlite:///{guardian_home / 'guardian.db'}").close()  # doctor opens a store, never creates one
    assert main(["doctor", "--json"]) == EXIT_OK
    report = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert report["store"]["status"] == "ok"
    assert report["python"]["status"] == "ok"
    assert "promtool" in report


def test_config_never_prints_the_database_password(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GUARDIAN_DB_URL", "postgresql://guardian:s3cret@db.internal:5432/guardian")
    assert main(["config"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "s3cret" not in out and "db.internal" in out
