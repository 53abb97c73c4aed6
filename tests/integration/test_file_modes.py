"""Files the guardian writes for others to read (the dashboards export, a run's attempt files, the recipe's parquet)
get the mode ``open()`` would give them under the umask (0644 under 022), not the owner-only mode of the temporary
file they are written through; the guardian's own state and anything that may hold a secret stay owner-only."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import fixture_path

from guardian.actions.launcher import RunFolder, prepare_attempt
from guardian.actions.runner import write_json_atomic
from guardian.atomic import write_atomically
from guardian.dashboards import export_all
from recipe import prepare_data


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(params=[0o022, 0o027])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    previous = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(previous)


def test_the_dashboards_export_is_readable_by_others_and_a_re_export_repairs_an_owner_only_file(
    tmp_path: Path, umask: int
) -> None:
    written = export_all(tmp_path)
    assert written and all(mode(p) == 0o666 & ~umask for p in written)
    os.chmod(written[0], 0o600)  # what an earlier export left
    again = export_all(tmp_path)
    assert again == [written[0]] and mode(written[0]) == 0o666 & ~umask
    assert export_all(tmp_path) == []  # nothing to do


def test_a_runs_attempt_files_are_readable_by_others(tmp_path: Path, umask: int) -> None:
    folder = RunFolder(tmp_path / "runs" / "r")
    attempt = prepare_attempt(
        folder, 1, argv=["python3", "-m", "verl.trainer.main_ppo", "trainer.save_freq=10"], extra_env={}, cwd=tmp_path
    )
    write_json_atomic(attempt / "exit.json", {"exit_code": 0})
    for name in ("command.json", "overrides.txt", "exit.json"):
        assert mode(attempt / name) == 0o666 & ~umask, name


def test_the_recipes_parquet_is_readable_by_others(tmp_path: Path, umask: int) -> None:
    out = tmp_path / "data"
    hotpot = fixture_path("recipe", "hotpotqa_train_100.json")
    argv = ["--hotpotqa", str(hotpot), "--out", str(out), "--train-size", "50", "--val-size", "10"]
    assert prepare_data.main(argv) == 0
    for name in ("train.parquet", "val.parquet"):
        assert mode(out / name) == 0o666 & ~umask, name


def test_what_is_not_meant_for_others_stays_owner_only(tmp_path: Path, umask: int) -> None:
    write_atomically(tmp_path / "state.json", b"{}")
    assert mode(tmp_path / "state.json") == 0o600
