"""Run ids typed by users never escape the guardian home nor break a log line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from guardian.cli import EXIT_USAGE, main
from guardian.config import ConfigError
from guardian.ids import MAX_RUN_ID, checked_run_id


@pytest.mark.parametrize("good", ["run-a", "demo-entropy_collapse-20261201-105645", "r1.v2", "A" * MAX_RUN_ID])
def test_valid_run_ids_pass_unchanged(good: str) -> None:
    assert checked_run_id(good) == good


@pytest.mark.parametrize(
    "bad", ["../../../x", "a/b", "..", ".hidden", "-rf", "a\nCRITICAL", "a b", "", "x" * (MAX_RUN_ID + 1), "é"]
)
def test_invalid_run_ids_are_usage_errors_naming_the_option(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"--attach .* is not a valid run id"):
        checked_run_id(bad, option="--attach")


@pytest.mark.parametrize("option", ["--run-id", "--attach"])
def test_guardian_run_refuses_a_path_as_run_id_before_writing_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    home = tmp_path / "nest" / "home"
    config = tmp_path / "guardian.yaml"
    config.write_text(f"home: {home}\n")
    argv = ["run", "--config", str(config), option, "../../../escaped"]
    argv += ["--", sys.executable, "-m", "verl.trainer.main_ppo"] if option == "--run-id" else []
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "is not a valid run id" in err and "Traceback" not in err
    assert not home.exists() and not (tmp_path / "escaped").exists()
