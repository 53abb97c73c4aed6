"""One guardian per checkpoint dir: the lock, its release on exit or death, and guardian run's refusal."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_run_e2e import collapse_command, config_for

from guardian.actions.dirlock import LOCK_NAME, DirLockedError, holding
from guardian.run import RunRequest, run_guarded
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
