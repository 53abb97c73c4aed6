"""Configuration errors are one plain report with exit 2: a run id from a fleet file cannot forge log lines
(red-team finding F4), and the exporter's refusal to listen on every interface is a config error naming the key and
value, not an internal error with a traceback file (O3)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from guardian.cli import EXIT_USAGE, main
from guardian.config import ConfigError, GuardianConfig
from guardian.fleet.spec import load_fleet

FORGED = "2026-12-02 00:00:00,000 CRITICAL guardian.run event=run_finished run=prod exit=0"


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GUARDIAN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GUARDIAN_DB_URL", raising=False)
    return tmp_path / "home"


@pytest.mark.parametrize("control", ["\n", "\x00", "\r", "\x1b[2J", "\u2028", "\x85"])
@pytest.mark.parametrize(
    "run",
    [
        "{run_id: RUNID, command: [python, x.py]}",  # a bad run id: the run_id error names it
        "{run_id: RUNID, command: [python, x.py], cmd: [y]}",  # another error of that run names it too
        '{run_id: RUNID, command: ""}',
    ],
)
def test_a_run_id_in_a_fleet_error_cannot_forge_a_log_line(
    tmp_path: Path, control: str, run: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = json.dumps(f"a{control}{FORGED}")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("runs:\n  - " + run.replace("RUNID", run_id) + "\n")
    with pytest.raises(ConfigError) as caught:
        load_fleet(fleet, GuardianConfig())
    message = str(caught.value)
    assert control == "\n" or control not in message
    assert all(line.startswith(("invalid fleet file", "  ")) for line in message.splitlines()), message
    assert main(["fleet", str(fleet)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert not [line for line in err.splitlines() if line.startswith("2026-12-02 00:00:00")], err
    assert control == "\n" or control not in err


def test_an_unknown_key_in_a_fleet_file_is_named_safely(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("runs:\n  - run_id: a\n    command: [x]\n    " + json.dumps(f"x\n{FORGED}") + ": 1\n")
    with pytest.raises(ConfigError) as caught:
        load_fleet(fleet, GuardianConfig())
    assert "\n2026" not in str(caught.value) and "(run a)" in str(caught.value)


PUBLIC = ["0", "::", "0x0", "0.0.0.0", "", "0.0", "::ffff:0.0.0.0"]


def metrics(folder: Path) -> Path:
    path = folder / "m.jsonl"
    path.write_text(json.dumps({"step": 1, "data": {"actor/entropy": 1.0}}) + "\n")
    return path


def assert_one_config_line(err: str, host: str, home: Path) -> None:
    lines = [line for line in err.splitlines() if " ERROR " in line or "Traceback" in line]
    assert len(lines) == 1, err
    assert f"exporter.host {host!r}" in lines[0] and "exporter.allow_public" in lines[0], lines[0]
    assert "internal_error" not in err and "Traceback" not in err
    assert not list((home / "logs").glob("internal-error-*")), "no traceback file"


@pytest.mark.parametrize("host", PUBLIC)
def test_watch_refuses_a_public_exporter_bind_as_a_config_error(
    host: str, tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "g.yaml"
    config.write_text(f"exporter: {{enabled: true, host: {json.dumps(host)}, port: 0}}\n")
    code = main(["watch", "--config", str(config), "--metrics", str(metrics(tmp_path)), "--no-follow", "--no-live"])
    assert code == EXIT_USAGE
    assert_one_config_line(capsys.readouterr().err, host, home)


def test_run_and_fleet_refuse_a_public_exporter_bind_as_a_config_error(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "g.yaml"
    config.write_text('exporter: {enabled: true, host: "0", port: 0}\n')
    marker = tmp_path / "started"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w')\n")
    trainer = [sys.executable, str(script)]
    code = main(["run", "--config", str(config), "--no-live", "--run-id", "pub", "--", *trainer])
    assert code == EXIT_USAGE and not marker.exists(), "refused before the trainer starts"
    assert_one_config_line(capsys.readouterr().err, "0", home)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("runs:\n  - run_id: a\n    command: " + json.dumps(trainer) + "\n")
    assert main(["fleet", "--config", str(config), str(fleet)]) == EXIT_USAGE
    assert not marker.exists()
    assert_one_config_line(capsys.readouterr().err, "0", home)


@pytest.mark.parametrize("control", ["\x85", "\x9b31m", "\x1b[2J"])
def test_an_event_value_escapes_c1_controls_too(control: str) -> None:
    from guardian.logs import event

    line = event("fleet_run_failed", {"run": f"a{control}b"})
    assert control[0] not in line and len(line.splitlines()) == 1
