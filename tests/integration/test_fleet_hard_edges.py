"""Hard edges of ``guardian run`` and ``guardian fleet`` found by the red-team pass (issue 24), each with real runs:

- F6: a run's registration waits (bounded) for a store another writer holds locked past the busy timeout, and the
  bound ends in one clear line, never a fleet run's traceback;
- F7: a run the store records as over (finished, or given up: 93, do not requeue) is not launched again by the
  same command, nor by the fleet again: one line says so and the recorded exit code is the answer;
- F10: two runs that share a rollout dump folder (``trainer.rollout_data_dir``) are refused, naming both and the
  folder: one run's rollback would move the other's dumps into its quarantine.
"""

from __future__ import annotations

import logging
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

import guardian.commands.run as run_command
from guardian.actions.dirlock import DirLockedError
from guardian.commands.fleet import guard_fleet, run_fleet
from guardian.commands.run import RunRequest, guard_request
from guardian.config import ConfigError, GuardianConfig
from guardian.exits import EXIT_GAVE_UP, EXIT_OK
from guardian.fleet.spec import load_fleet
from guardian.states import RunStatus
from guardian.store import Store, StoreError

QUICK = "import sys; sys.exit(0)\n"  # a trainer that ends well at once


def config_for(home: Path, **store: float) -> GuardianConfig:
    return GuardianConfig.model_validate(
        {
            "home": str(home),
            "sources": {"poll_interval_s": 0.05},
            "intervention": {"stop_sigint_s": 1, "stop_sigterm_s": 1, "stop_sigkill_s": 2},
            "exporter": {"enabled": False, "linger_s": 0},
            **({"store": store} if store else {}),
        }
    )


def quick_command(tmp_path: Path, name: str, *extra: str) -> tuple[str, ...]:
    script = tmp_path / "quick.py"
    script.write_text(QUICK)
    return (sys.executable, str(script), f"trainer.default_local_dir={tmp_path / 'ckpt' / name}", *extra)


def fleet_file(tmp_path: Path, runs: dict[str, tuple[str, ...]]) -> Path:
    text = "runs:\n" + "".join(f"  - run_id: {run}\n    command: {list(command)!r}\n" for run, command in runs.items())
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return path


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage() + ("\nTraceback" if record.exc_info else ""))


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger("guardian")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


# ------------------------------------------------------------------------------------ F6: a locked store


def hold_write_lock(db: Path, seconds: float) -> threading.Thread:
    """Take the SQLite file's write lock now (another writer's long transaction) and let it go after ``seconds``."""
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")

    def release() -> None:
        time.sleep(seconds)
        holder.execute("COMMIT")
        holder.close()

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    return thread


def test_registering_a_run_waits_for_a_writer_that_holds_the_lock_past_the_busy_timeout(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    with Store.open(f"sqlite:///{db}", busy_timeout_s=0.05) as store:
        released = hold_write_lock(db, 1.0)
        began = time.monotonic()
        run = store.ensure_run(
            "r1", name="r1", metrics_path="m", rollouts_dir="d", checkpoints_dir=None, mode="enforce", now=1.0
        )
        attempt = store.start_attempt("r1", metrics_path="m", now=2.0)
        assert time.monotonic() - began >= 0.8, "it waited for the holder"
        released.join(5)
        assert run.id == "r1" and attempt.number == 1


def test_a_registration_that_waits_past_its_bound_fails_in_one_clear_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import guardian.store.repository as repository

    monkeypatch.setattr(repository, "REGISTER_WAIT_S", 0.3, raising=False)
    db = tmp_path / "g.db"
    with Store.open(f"sqlite:///{db}", busy_timeout_s=0.05) as store:
        released = hold_write_lock(db, 2.0)
        with pytest.raises(StoreError) as caught:
            store.ensure_run(
                "r1", name="r1", metrics_path="m", rollouts_dir="d", checkpoints_dir=None, mode="enforce", now=1.0
            )
        released.join(5)
    said = str(caught.value)
    assert "run r1" in said and "locked" in said and "0.3" in said and "\n" not in said, said


def test_a_fleet_whose_store_is_locked_while_its_runs_register_guards_every_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lines: Lines
) -> None:
    """The red-team's 64-run fleet lost 5-9 runs to "database is locked" in ``register_run``: here the lock is held
    (by another writer) exactly while the runs register, with a busy timeout far shorter than the hold."""
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    config = config_for(home, busy_timeout_s=0.05)
    runs = {f"r{k}": quick_command(tmp_path, f"r{k}") for k in range(4)}
    fleet = load_fleet(fleet_file(tmp_path, runs), config)
    real = run_command.run_layout
    taken = threading.Lock()

    def layout_then_lock(*args: object, **kwargs: object) -> object:
        made = real(*args, **kwargs)  # type: ignore[arg-type]
        if taken.acquire(blocking=False):  # the first run to get here: its registration and the others' wait
            hold_write_lock(home / "guardian.db", 1.0)
        return made

    monkeypatch.setattr(run_command, "run_layout", layout_then_lock)
    codes = guard_fleet(config, fleet, threading.Event())
    assert codes == dict.fromkeys(runs, EXIT_OK), "\n".join(lines.lines)
    assert not any("Traceback" in line or "fleet_run_failed" in line for line in lines.lines)
    with Store.open(config.database_url()) as store:
        assert sorted(run.id for run in store.list_runs()) == sorted(runs)


# ------------------------------------------------------------------------ F7: a run over stays over


def test_the_same_run_command_again_does_not_relaunch_a_finished_run(tmp_path: Path, lines: Lines) -> None:
    config = config_for(tmp_path / "home")
    request = RunRequest(command=quick_command(tmp_path, "a"), cwd=tmp_path, run_id="a")
    assert guard_request(config, request, threading.Event()) == EXIT_OK
    lines.lines.clear()
    assert guard_request(config, request, threading.Event()) == EXIT_OK  # the recorded code
    with Store.open(config.database_url()) as store:
        assert [run.id for run in store.list_runs()] == ["a"], "no new run under a fresh id"
        assert len(store.attempts("a")) == 1, "no second trainer"
    said = [line for line in lines.lines if "run_already_over" in line]
    assert len(said) == 1 and "run=a" in said[0] and "status=finished" in said[0] and "exit=0" in said[0]
    assert "--new" in said[0], "how to start it again deliberately"
    assert not any("event=trainer_launch" in line for line in lines.lines)
    # --attach to it as well: a run that is over has no trainer to guard (a stopped one would read as a crash)
    lines.lines.clear()
    assert guard_request(config, replace(request, attach=True), threading.Event()) == EXIT_OK
    assert any("run_already_over" in line for line in lines.lines)
    with Store.open(config.database_url()) as store:
        assert len(store.attempts("a")) == 1


def test_a_run_that_gave_up_answers_93_again_and_new_starts_a_new_run_deliberately(tmp_path: Path) -> None:
    config = config_for(tmp_path / "home")
    request = RunRequest(command=quick_command(tmp_path, "g"), cwd=tmp_path, run_id="g")
    assert guard_request(config, request, threading.Event()) == EXIT_OK
    with Store.open(config.database_url()) as store:
        store.set_run_status("g", RunStatus.GAVE_UP)  # as a rescue that gave up leaves it
    assert guard_request(config, request, threading.Event()) == EXIT_GAVE_UP
    with Store.open(config.database_url()) as store:
        assert [run.id for run in store.list_runs()] == ["g"]
    # asked for: a new run under a fresh id beside it
    assert guard_request(config, replace(request, new=True), threading.Event()) == EXIT_OK
    with Store.open(config.database_url()) as store:
        ids = sorted(run.id for run in store.list_runs())
    assert len(ids) == 2 and ids[0] == "g" and ids[1].startswith("g-")


def test_the_fleet_again_says_already_finished_instead_of_launching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    config = config_for(tmp_path / "home")
    runs = {"one": quick_command(tmp_path, "one"), "two": quick_command(tmp_path, "two")}
    path = fleet_file(tmp_path, runs)
    assert run_fleet(config, load_fleet(path, config)) == EXIT_OK
    capsys.readouterr()
    with Store.open(config.database_url()) as store:
        store.set_run_status("two", RunStatus.GAVE_UP)
    assert run_fleet(config, load_fleet(path, config)) == EXIT_GAVE_UP
    out = capsys.readouterr().out
    assert "one  exit 0    already finished (exit 0)" in out, out
    assert "two  exit 93   already gave up (exit 93)" in out, out
    with Store.open(config.database_url()) as store:
        assert sorted(run.id for run in store.list_runs()) == ["one", "two"]
        assert [len(store.attempts(run)) for run in ("one", "two")] == [1, 1]


# --------------------------------------------------------------------- F10: one dump folder, one run


def test_a_fleet_whose_runs_share_a_rollout_dump_folder_is_refused_naming_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = config_for(tmp_path / "home")
    dumps = tmp_path / "dumps"
    runs = {
        "a": quick_command(tmp_path, "a", f"trainer.rollout_data_dir={dumps}"),
        "b": quick_command(tmp_path, "b", f"trainer.rollout_data_dir={dumps}"),
        "c": quick_command(tmp_path, "c", f"trainer.rollout_data_dir={tmp_path / 'own'}"),
    }
    with pytest.raises(ConfigError) as caught:
        guard_fleet(config, load_fleet(fleet_file(tmp_path, runs), config), threading.Event())
    said = str(caught.value)
    assert "run a" in said and "run b" in said and str(dumps) in said and "run c" not in said, said
    assert not (tmp_path / "home" / "runs").exists(), "nothing started"


def test_a_run_whose_dump_folder_another_guardian_guards_is_refused_naming_both(tmp_path: Path, lines: Lines) -> None:
    from guardian.actions.launcher import holding_dumps

    dumps = tmp_path / "dumps"
    with holding_dumps(dumps, "a"):
        with pytest.raises(DirLockedError) as caught, holding_dumps(dumps, "b"):
            pass
        said = str(caught.value)
        assert "run a" in said and "run b" in said and str(dumps) in said, said
        config = config_for(tmp_path / "home")
        command = quick_command(tmp_path, "b", f"trainer.rollout_data_dir={dumps}")
        assert guard_request(config, RunRequest(command=command, cwd=tmp_path, run_id="b"), threading.Event()) == 1
        with Store.open(config.database_url()) as store:
            assert store.get_run("b") is None, "refused before it was registered"
        assert any("rollout_dir_locked" in line and "run a" in line for line in lines.lines)
    with holding_dumps(dumps, "b"):  # free again once its guardian let go
        pass


def test_guardian_run_again_on_the_command_line_says_so_and_new_starts_another(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from guardian.cli import EXIT_USAGE, main

    home = tmp_path / "home"
    (tmp_path / "guardian.yaml").write_text(f"home: {home}\nsources:\n  poll_interval_s: 0.05\n")
    argv = ["run", "--config", str(tmp_path / "guardian.yaml"), "--no-live", "--", *quick_command(tmp_path, "cli")]
    assert main(argv) == EXIT_OK
    capsys.readouterr()
    assert main(argv) == EXIT_OK
    err = capsys.readouterr().err
    assert err.count("event=run_already_over") == 1 and "Traceback" not in err, err
    assert main([*argv[:4], "--new", *argv[4:]]) == EXIT_OK
    assert main(["run", "--config", str(tmp_path / "guardian.yaml"), "--new", "--attach", "x"]) == EXIT_USAGE
    with Store.open(f"sqlite:///{home / 'guardian.db'}") as store:
        assert len(store.list_runs()) == 2
