"""``guardian run`` on a trainer that fails before its first training step (an import error, a bad config): a setup
failure. Its output is kept, one line says so, and the run ends with exit 2 - never relaunched, where a crash would
be restarted: the same command would fail the same way after another start-up (minutes at 7B)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from guardian.commands.run import RunRequest, run_guarded
from guardian.config import GuardianConfig
from guardian.exits import EXIT_USAGE
from guardian.store import Store


def test_a_trainer_that_dies_at_its_import_is_a_setup_failure_kept_said_and_not_relaunched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    home, script = tmp_path / "home", tmp_path / "train.py"
    script.write_text("print('loading the model')\nimport no_such_trainer_package\n")
    broken = (sys.executable, str(script))
    config = GuardianConfig.model_validate({"home": str(home), "mode": "enforce", "sources": {"poll_interval_s": 0.05}})
    with caplog.at_level("INFO", logger="guardian"):
        code = run_guarded(config, RunRequest(broken, tmp_path, "broken"))
    assert code == EXIT_USAGE
    with Store.open(config.database_url()) as store:
        assert len(store.attempts("broken")) == 1, "launched once, never relaunched"
        assert store.interventions("broken") == []
        (incident,) = store.list_incidents("broken")
    assert incident.check == "setup_failure"
    assert incident.message.endswith("exit code 1: ModuleNotFoundError: No module named 'no_such_trainer_package'")
    assert "loading the model" in str(incident.evidence["stdout_tail"])
    (line,) = [r.getMessage() for r in caplog.records if "event=setup_failed" in r.getMessage()]
    stdout = home / "runs" / "broken" / "attempt-1" / "stdout.log"
    assert "run=broken attempt=1" in line and f"log={stdout}" in line and "exit_code=2" in line
    assert 'output="guardian incidents show 1"' in line
    again = run_guarded(config, RunRequest(broken, tmp_path, "broken"))
    assert again == EXIT_USAGE, "the run is over: asked again, it answers its recorded end, launching nothing"


def test_a_bad_config_value_is_a_setup_failure_too(tmp_path: Path) -> None:
    config = GuardianConfig.model_validate({"home": str(tmp_path / "home"), "sources": {"poll_interval_s": 0.05}})
    command = (sys.executable, "-m", "guardian.demo.trainer", "actor_rollout_ref.actor.optim.lr=abc")
    assert run_guarded(config, RunRequest(command, tmp_path, "typo")) == EXIT_USAGE
    with Store.open(config.database_url()) as store:
        assert len(store.attempts("typo")) == 1
        (incident,) = store.list_incidents("typo")
    assert incident.check == "setup_failure" and "must be a number, got 'abc'" in str(incident.evidence["stdout_tail"])
