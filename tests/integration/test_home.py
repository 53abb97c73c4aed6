"""One home for the history whatever folder a command starts in (guardian/home.py; issue 25, item 3): the rule
itself, then the commands run from a project's subfolder, from an unrelated folder, and with a ./guardian.yaml."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.resources import files
from pathlib import Path

import pytest

from guardian.cli import EXIT_ERROR, EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE, main
from guardian.config import ConfigError
from guardian.home import HomeFrom, config_candidates, locate, owned_folder, resolve_home, state_folder

USER = Path("/home/ann")


def no_home(_: Path) -> bool:
    return False


def home_at(*homes: str) -> Callable[[Path], bool]:
    return lambda path: str(path) in homes


# ------------------------------------------------------------------------------------------------- the rule (pure)


def test_guardian_home_wins_and_is_read_from_the_current_folder() -> None:
    home = resolve_home(
        {"GUARDIAN_HOME": "h"}, Path("/p/sub"), file_home=(Path("/x"), Path("/p/sub/g.yaml")), is_home=no_home,
        user_home=USER,
    )  # fmt: skip
    assert (home.path, home.source) == (Path("/p/sub/h"), HomeFrom.ENV)


def test_a_config_files_home_comes_next() -> None:
    home = resolve_home(
        {}, Path("/p"), file_home=(Path("/x/h"), Path("/x/guardian.yaml")), is_home=home_at("/p/.guardian"),
        user_home=USER,
    )  # fmt: skip
    assert (home.path, home.source) == (Path("/x/h"), HomeFrom.CONFIG)


def test_the_nearest_guardian_folder_up_from_the_current_one() -> None:
    found = resolve_home(
        {}, Path("/p/a/b"), file_home=None, is_home=home_at("/p/.guardian", "/.guardian"), user_home=USER
    )
    assert (found.path, found.source) == (Path("/p/.guardian"), HomeFrom.PROJECT)
    assert "/p/a/b" in found.why


def test_the_search_stops_below_a_ceiling_then_the_per_user_state_folder() -> None:
    env = {"GUARDIAN_CEILING_DIRECTORIES": os.pathsep.join(["/p", "relative/ignored"])}
    home = resolve_home(env, Path("/p/a/b"), file_home=None, is_home=home_at("/p/.guardian"), user_home=USER)
    assert (home.path, home.source) == (USER / ".local/state/verl-guardian", HomeFrom.USER)
    assert "/p/a/b and its parents up to /p/a" in home.why


def test_the_state_folder_follows_xdg_but_not_a_relative_one() -> None:
    assert state_folder({"XDG_STATE_HOME": "/s"}, USER) == Path("/s/verl-guardian")
    assert state_folder({"XDG_STATE_HOME": "rel"}, USER) == USER / ".local/state/verl-guardian"
    with pytest.raises(ConfigError, match="set GUARDIAN_HOME"):
        state_folder({}, None)


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="giving a folder away needs root")
def test_a_guardian_folder_owned_by_another_user_is_passed_over(tmp_path: Path) -> None:
    theirs, mine = tmp_path / "theirs" / ".guardian", tmp_path / "mine" / ".guardian"
    theirs.mkdir(parents=True)
    mine.mkdir(parents=True)
    os.chown(theirs, 65534, 65534)
    assert owned_folder(mine) and not owned_folder(theirs) and not owned_folder(tmp_path / "none")


def test_config_files_tried_in_order() -> None:
    project = resolve_home({}, Path("/p/a"), file_home=None, is_home=home_at("/p/.guardian"), user_home=USER)
    assert config_candidates(Path("/p/a"), project) == [
        Path("/p/a/guardian.yaml"),
        Path("/p/guardian.yaml"),
        Path("/p/.guardian/guardian.yaml"),
    ]


# ---------------------------------------------------------------------------------------- the commands, end to end


@contextmanager
def inside(folder: Path) -> Iterator[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield folder
    finally:
        os.chdir(before)


def using_line(err: str) -> str:
    lines = [line for line in err.splitlines() if " event=using " in f" {line}"]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def project(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """A project folder with a ``.guardian/`` home that a watch (run from the project) filled with incidents."""
    root = tmp_path / "project"
    (root / ".guardian").mkdir(parents=True)
    trace = root / "metrics.jsonl"
    trace.write_bytes(files("guardian.data").joinpath("aopd-2.jsonl").read_bytes())
    with inside(root):
        assert main(["watch", "--metrics", str(trace), "--no-live", "--max-ticks", "3"]) == EXIT_UNHEALTHY
    assert (root / ".guardian" / "guardian.db").is_file()
    capsys.readouterr()
    return root


def test_from_a_subfolder_of_the_project_incidents_list_finds_its_incidents(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with inside(project / "scripts" / "deep"):
        assert main(["incidents", "list", "--json"]) == EXIT_OK
    out, err = capsys.readouterr()
    assert any(i["check"] == "length_collapse" for i in json.loads(out))  # stdout: the JSON document only
    line = using_line(err)
    assert f"home={project / '.guardian'}" in line and "home_from=project" in line
    assert f"store=sqlite:///{project / '.guardian' / 'guardian.db'}" in line and "config=defaults" in line
    assert not (project / "scripts" / "deep" / ".guardian").exists()


def test_from_an_unrelated_folder_a_read_only_command_creates_nothing_and_says_where_it_looked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = Path(os.environ["XDG_STATE_HOME"]) / "verl-guardian"
    elsewhere = tmp_path / "elsewhere"
    with inside(elsewhere):
        for argv in (
            ["incidents", "list"],
            ["incidents", "show", "1"],
            ["report", "1", "-o", "r.html"],
            ["checklist", "some-run"],
            ["checkpoints", "some-run"],
        ):
            assert main(argv) == EXIT_ERROR, argv
            err = capsys.readouterr().err
            assert "no incidents" not in err
            assert f"no guardian store at {state / 'guardian.db'}" in err, err
            assert f"no GUARDIAN_HOME, no .guardian/ in {elsewhere} and its parents" in err
            assert "set GUARDIAN_HOME" in err and "nothing was created" in err
    assert not state.exists() and list(elsewhere.iterdir()) == []


def test_guardian_home_that_holds_no_store_is_said_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GUARDIAN_HOME", str(tmp_path / "typo"))
    assert main(["incidents", "list", "--json"]) == EXIT_ERROR
    out, err = capsys.readouterr()
    assert out == "" and "the home" in err and "is $GUARDIAN_HOME" in err
    assert not (tmp_path / "typo").exists()


def test_the_guardian_yaml_in_the_current_folder_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with inside(tmp_path / "here") as here:
        (here / "guardian.yaml").write_text("home: history\nmode: advise\n")
        assert main(["config"]) == EXIT_OK
    out, err = capsys.readouterr()
    shown = json.loads(out)
    assert shown["mode"] == "advise" and shown["home"] == str(here / "history")
    line = using_line(err)
    assert f"config={here / 'guardian.yaml'}" in line and "home_from=config" in line


def test_the_projects_guardian_yaml_is_read_from_a_subfolder(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "guardian.yaml").write_text("mode: observe\n")
    with inside(project / "sub"):
        assert main(["config"]) == EXIT_OK
    out, err = capsys.readouterr()
    assert json.loads(out)["mode"] == "observe"
    assert f"config={project / 'guardian.yaml'}" in using_line(err)


def test_a_file_found_through_the_home_cannot_move_it(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "guardian.yaml").write_text("home: /somewhere/else\n")
    with inside(project / "sub"):
        assert main(["config"]) == EXIT_USAGE
        with pytest.raises(ConfigError, match="found through the home"):
            locate(None)
    assert "remove its home:" in capsys.readouterr().err


def test_the_line_masks_the_database_password(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GUARDIAN_DB_URL", "postgresql+psycopg://guardian:s3cret@db.internal:5432/guardian")
    monkeypatch.setenv("GUARDIAN_MODE", "observe")
    assert main(["config"]) == EXIT_OK
    line = using_line(capsys.readouterr().err)
    assert "s3cret" not in line and "guardian:***@db.internal" in line
    assert 'config="defaults + $GUARDIAN_DB_URL + $GUARDIAN_MODE"' in line


def test_doctor_says_a_missing_store_and_creates_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--json"]) == EXIT_OK
    report = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert report["store"]["status"] == "missing" and "no guardian store at" in report["store"]["detail"]
    assert report["home"]["detail"].startswith(os.environ["XDG_STATE_HOME"])
    assert not (Path(os.environ["XDG_STATE_HOME"]) / "verl-guardian").exists()
