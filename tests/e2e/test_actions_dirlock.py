"""One guardian per checkpoint dir: the lock, its release on exit or death, and guardian run's refusal."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from collapse_run import collapse_command, config_for

from guardian.actions import strays
from guardian.actions.dirlock import LOCK_NAME, DirLockedError, holding
from guardian.checkpoints.quarantine import quarantine_after
from guardian.checkpoints.scan import TRACKER_FILE
from guardian.cli import main
from guardian.commands.run import RunRequest, run_guarded
from guardian.store import Store


def test_a_second_holder_is_refused_naming_the_first_until_it_lets_go(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    with holding(ckpt, "run-a") as lock:
        assert lock == ckpt / LOCK_NAME and "run=run-a" in lock.read_text()
        with (
            pytest.raises(DirLockedError, match=r"guarded by another guardian \(run=run-a pid=\d+"),
            holding(ckpt, "b"),
        ):
            pass
    with holding(ckpt, "run-b") as lock:  # released on exit
        assert "run=run-b" in lock.read_text()


def test_the_lock_dies_with_its_process_even_under_kill_9(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from pathlib import Path
                from guardian.actions.dirlock import holding
                with holding(Path({str(tmp_path)!r}), "doomed"):
                    print("held", flush=True)
                    time.sleep(60)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    with pytest.raises(DirLockedError), holding(tmp_path, "me"):
        pass
    holder.kill()
    holder.wait(10)
    holder.stdout.close()
    with holding(tmp_path, "me"):
        pass


def test_guardian_run_refuses_a_checkpoint_dir_another_guardian_holds(tmp_path: Path) -> None:
    home, ckpt = tmp_path / "home", tmp_path / "ckpt"
    config = config_for(home)
    with holding(ckpt, "the-other-run"):
        code = run_guarded(config, RunRequest(tuple(collapse_command(ckpt)), tmp_path, "second"))
    assert code == 1
    with Store.open(config.database_url()) as store:
        assert store.get_run("second") is None  # nothing registered, nothing launched
    assert not (home / "runs" / "second").exists() or not any((home / "runs" / "second").rglob("stdout.log"))


def test_checkpoints_restore_waits_for_no_guardian_to_hold_the_dir(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    for step in (5, 10):
        (ckpt / f"global_step_{step}" / "actor").mkdir(parents=True)
    (ckpt / TRACKER_FILE).write_text("10")
    quarantine_after(ckpt, 5, incident_id=1)
    config = tmp_path / "guardian.yaml"
    config.write_text(f"home: {tmp_path / 'home'}\n")
    with Store.open(f"sqlite:///{tmp_path / 'home' / 'guardian.db'}") as store:
        store.ensure_run(
            "r", name="r", metrics_path="m", rollouts_dir="", checkpoints_dir=str(ckpt), mode="enforce", now=0.0
        )
    restore = ["checkpoints", "restore", "r", "--incident", "1", "--config", str(config)]
    with holding(ckpt, "a-live-run"):
        assert main(restore) == 1  # a guardian may be rolling this dir back right now
    assert not (ckpt / "global_step_10").exists()
    assert main(restore) == 0
    assert (ckpt / "global_step_10").is_dir() and (ckpt / TRACKER_FILE).read_text().strip() == "10"


def test_a_trainer_left_running_by_a_stopped_guardian_keeps_other_runs_out(tmp_path: Path) -> None:
    ckpt, folder = tmp_path / "ckpt", tmp_path / "runs" / "first"
    with holding(ckpt, "first", folder):
        pass  # the first guardian stopped (Ctrl-C) ...
    orphan = subprocess.Popen(  # ... and left its trainer running
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, **strays.marker_env(str(folder / "attempt-1" / "exit.json"))},
    )
    try:
        wait = time.monotonic() + 10
        while not strays.find(str(folder), under=True) and time.monotonic() < wait:
            time.sleep(0.05)
        second = holding(ckpt, "second", tmp_path / "runs" / "second")
        with pytest.raises(DirLockedError, match=r"a trainer of run first still runs .*--attach first"), second:
            pass
        with holding(ckpt, "first", folder):  # its own run may re-attach
            pass
    finally:
        orphan.kill()
        orphan.wait(10)
    with holding(ckpt, "second", tmp_path / "runs" / "second"):  # the trainer is gone: free for others
        pass
