"""``guardian stop RUN``: stop a run's trainer through the guardian's own stop path (SIGINT, SIGTERM, SIGKILL to its
process group, as the rescue stops it) and record the run as over, whether its ``guardian run`` is alive (it is told
to stop guarding first, so the trainer's end is never taken for a crash to restart) or not (the trainer is stopped
directly). Refused, touching nothing, for an unknown run, a run already over, or a trainer that is not running."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import orjson
import pytest

from guardian.actions.process import _group_alive
from guardian.cli import EXIT_ERROR, EXIT_OK, main
from guardian.exits import EXIT_INTERRUPTED
from guardian.states import RunStatus
from guardian.store import Store

NOW = 1_700_000_000.0


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "GUARDIAN_HOME": str(home)}
    env.pop("GUARDIAN_DB_URL", None)
    return env


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    monkeypatch.setenv("GUARDIAN_HOME", str(folder))
    monkeypatch.delenv("GUARDIAN_DB_URL", raising=False)
    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("LOGNAME", "alice")
    return folder


def _stop(*argv: str) -> int:
    return main(["--log-level", "ERROR", "stop", *argv])


def _store(home: Path) -> Store:
    return Store.open(f"sqlite:///{home / 'guardian.db'}")


def _run(home: Path, run_id: str, *, status: RunStatus = RunStatus.ACTIVE, folder: Path | None = None) -> None:
    with _store(home) as store:
        store.ensure_run(
            run_id,
            name=run_id,
            metrics_path=str(folder or home / "runs" / run_id),
            rollouts_dir="",
            checkpoints_dir=str(home / "ckpt"),
            mode="enforce",
            now=NOW,
            config_json=orjson.dumps({"command": ["python", "train.py"], "cwd": str(home)}).decode(),
        )
        store.start_attempt(run_id, metrics_path=str(home / "m.jsonl"), now=NOW)
        if status is not RunStatus.ACTIVE:
            store.set_run_status(run_id, status)


# ------------------------------------------------------------------------------------------ refusals


def test_an_unknown_run_is_refused_naming_the_known_ones(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run(home, "run-a")
    assert _stop("run-b") == EXIT_ERROR
    err = capsys.readouterr().err
    assert "no run 'run-b'" in err and "run-a" in err


@pytest.mark.parametrize("status", [RunStatus.FINISHED, RunStatus.GAVE_UP])
def test_a_run_already_over_is_refused(home: Path, status: RunStatus, capsys: pytest.CaptureFixture[str]) -> None:
    _run(home, "run-a", status=status)
    assert _stop("run-a") == EXIT_ERROR
    assert f"run run-a is already over ({status})" in capsys.readouterr().err


def test_a_trainer_never_launched_or_gone_is_refused_and_nothing_recorded(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(home, "run-a")
    assert _stop("run-a") == EXIT_ERROR
    assert "run run-a: no trainer of attempt 1 is running (it was never launched by guardian run)" in (
        capsys.readouterr().err
    )
    # a trainer that ended: its wrapper's records say so
    attempt = home / "runs" / "run-a" / "attempt-1"
    attempt.mkdir(parents=True)
    (attempt / "exit.json.pid").write_text(json.dumps({"pid": 999_999, "runner_pid": 999_999, "started_at": NOW}))
    (attempt / "exit.json").write_text(json.dumps({"exit_code": 1, "signal": None}))
    assert _stop("run-a") == EXIT_ERROR
    assert "no trainer of attempt 1 is running (it ended: exit code 1)" in capsys.readouterr().err
    with _store(home) as store:
        run = store.get_run("run-a")
        assert run is not None and run.status == RunStatus.ACTIVE
        (only,) = store.attempts("run-a")
        assert only.ended_at is None


# ------------------------------------------------------------------------------------------ end to end


def _command(ckpt: Path) -> list[str]:
    """The demo trainer, slowed so it is still running when it is stopped."""
    return [
        sys.executable,
        "-m",
        "guardian.demo.trainer",
        "trainer.total_training_steps=2000",
        "trainer.total_epochs=1000",
        "trainer.save_freq=1000",
        f"trainer.default_local_dir={ckpt}",
        "+trainer.fault.slow_steps=0.1",
    ]


def _guard(tmp_path: Path, home: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``guardian run`` in enforce mode, once its trainer has logged 3 steps; returns it and the run's id."""
    (tmp_path / "guardian.yaml").write_text(
        "sources: {poll_interval_s: 0.05}\nintervention: {stop_sigint_s: 5, stop_sigterm_s: 5, stop_sigkill_s: 5}\n"
    )
    err = tmp_path / "guardian.err"
    with err.open("wb") as stderr:
        guardian = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "guardian",
                "--log-level",
                "WARNING",
                "run",
                "--config",
                "guardian.yaml",
                "--no-live",
                "--run-id",
                "stop-me",
                "--",
                *_command(tmp_path / "ckpt"),
            ],
            cwd=tmp_path,
            env=_env(home),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    metrics = home / "runs" / "stop-me" / "attempt-1" / "metrics.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_bytes().splitlines()) >= 3:
            return guardian, "stop-me"
        assert guardian.poll() is None, err.read_text()[-3000:]
        time.sleep(0.1)
    guardian.kill()
    raise AssertionError("the trainer logged no 3 steps in 60 s")


def _trainer_pgid(home: Path, run_id: str, number: int) -> int:
    record = json.loads((home / "runs" / run_id / f"attempt-{number}" / "exit.json.pid").read_text())
    return int(record["runner_pid"])


def _assert_stopped(home: Path, run_id: str, pgid: int) -> None:
    assert not _group_alive(pgid)
    with _store(home) as store:
        run = store.get_run(run_id)
        assert run is not None and run.status == RunStatus.FINISHED
        stopped = orjson.loads(run.config_json or "{}")["stopped"]
        assert stopped["by"] == "alice" and stopped["attempt"] == 1 and stopped["signals"][0] == "SIGINT"
        (attempt,) = store.attempts(run_id)  # nothing relaunched
        assert attempt.ended_at is not None
        assert not store.list_incidents(run_id)  # the stop is no crash
        assert not store.interventions(run_id)


@pytest.mark.slow
def test_a_guarded_run_is_stopped_through_its_guardian_never_taken_for_a_crash(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    guardian, run_id = _guard(tmp_path, home)
    pgid = _trainer_pgid(home, run_id, 1)
    try:
        assert _stop(run_id, "--reason", "wrong dataset") == EXIT_OK
        said = capsys.readouterr().out
        assert guardian.wait(timeout=30) == EXIT_INTERRUPTED  # it stopped guarding; its trainer was stopped after
    finally:
        if guardian.poll() is None:
            guardian.kill()
    assert f"run {run_id}: its guardian (pid {guardian.pid}) stopped guarding" in said
    assert f"run {run_id} stopped: attempt 1's trainer (process group {pgid}) " in said
    _assert_stopped(home, run_id, pgid)
    with _store(home) as store:
        run = store.get_run(run_id)
        assert run is not None and orjson.loads(run.config_json or "{}")["stopped"]["reason"] == "wrong dataset"
    # the same guardian run again answers the run's end and launches nothing
    own = ["run", "--config", "guardian.yaml", "--no-live", "--run-id", run_id]
    again = subprocess.run(
        [sys.executable, "-m", "guardian", *own, "--", *_command(tmp_path / "ckpt")],
        cwd=tmp_path,
        env=_env(home),
        capture_output=True,
        timeout=60,
    )
    assert b"run_already_over" in again.stderr, again.stderr.decode()[-3000:]
    assert not (home / "runs" / run_id / "attempt-2").exists()


@pytest.mark.slow
def test_a_trainer_left_running_by_its_guardian_is_stopped_directly(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    guardian, run_id = _guard(tmp_path, home)
    guardian.send_signal(signal.SIGINT)  # Ctrl-C: the guardian stops, its trainer goes on
    assert guardian.wait(timeout=30) == EXIT_INTERRUPTED
    pgid = _trainer_pgid(home, run_id, 1)
    assert _group_alive(pgid)
    assert _stop(run_id) == EXIT_OK
    said = capsys.readouterr().out
    assert "stopped guarding" not in said
    assert f"run {run_id} stopped: attempt 1's trainer (process group {pgid}) " in said
    _assert_stopped(home, run_id, pgid)
    assert _stop(run_id) == EXIT_ERROR  # over now


@pytest.mark.parametrize(
    ("host", "argv", "said"),
    [
        ("elsewhere", [], "run run-a is guarded from host elsewhere (pid {pid}): run guardian stop run-a there"),
        (None, ["fleet", "runs.yaml"], "run run-a is guarded by guardian fleet (pid {pid}), which guards other runs"),
    ],
)
def test_a_guardian_it_must_not_signal_is_refused_and_nothing_touched(
    home: Path, host: str | None, argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A guardian on another host, or a fleet (one signal would stop every run's guardian): refused."""
    _run(home, "run-a")
    trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *argv])
    attempt = home / "runs" / "run-a" / "attempt-1"
    attempt.mkdir(parents=True)
    record = {"pid": trainer.pid, "runner_pid": trainer.pid, "started_at": NOW}
    (attempt / "exit.json.pid").write_text(json.dumps(record))
    try:
        (home / "ckpt").mkdir()
        lock = home / "ckpt" / ".guardian.lock"
        lock.write_text(f"run=run-a pid={other.pid} host={host or socket.gethostname()}\n")
        with lock.open("rb") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            with mock.patch("guardian.actions.process.LocalProcessControl._foreign_leader", return_value=None):
                assert _stop("run-a") == EXIT_ERROR
        assert said.format(pid=other.pid) in capsys.readouterr().err
        assert other.poll() is None and trainer.poll() is None  # neither was signalled
    finally:
        for process in (trainer, other):
            process.kill()
            process.wait()
