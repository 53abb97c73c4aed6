"""The checkpoint dir as someone else may have left it (hard-edges-2026-12, C1-C7, C9, C10): a planted symlink or
the wrong kind of entry where the guardian keeps its own lock file and folders is refused in one clear error that
names the path, and nothing outside the checkpoint dir is written, linked, moved or removed; step folders count
only under the names verl writes (``global_step_<N>``, N canonical ASCII decimal); the tracker is never pointed at
a folder that does not exist, never blocks the guardian when it is a FIFO, and keeps verl's mode."""

from __future__ import annotations

import os
import signal
import stat
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest
from collapse_run import collapse_command, config_for
from conftest import ManualClock
from verl_saves import retention_deletes, save

from guardian.actions.dirlock import LOCK_NAME, DirLockedError, holding
from guardian.checkpoints.pinner import Pinner
from guardian.checkpoints.pinning import (
    PIN_DIR,
    PinError,
    pin_checkpoint,
    pinned_steps,
    release_pin,
    remove_leftovers,
    restore_pin,
    set_aside_pins,
)
from guardian.checkpoints.quarantine import QUARANTINE_DIR, quarantine_after, quarantine_all, quarantine_dumps_after
from guardian.checkpoints.restore import restore_quarantine
from guardian.checkpoints.scan import TRACKER_FILE, CheckpointError, read_tracker, scan_checkpoints
from guardian.checkpoints.target import resume_path_for
from guardian.checkpoints.view import read_checkpoints
from guardian.checkpoints.writes import write_tracker
from guardian.cli import main
from guardian.commands.run import RunRequest, run_guarded
from guardian.config import CheckpointsConfig
from guardian.incidents.health import StepHealth
from guardian.store import Store

FREE = 1 << 40


class Blocked(BaseException):
    """Not an Exception: no ``except Exception`` of the code under test may swallow it."""


@pytest.fixture
def deadline() -> Iterator[None]:
    """Fail (instead of hanging the suite) when a call blocks for more than 5 s."""

    def expired(signum: int, frame: FrameType | None) -> None:
        raise Blocked("blocked for 5 s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(5)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def ckpt_with(tmp_path: Path, *steps: int, tracker: int | None = None) -> Path:
    ckpt = tmp_path / "ckpt"
    for step in steps:
        (ckpt / f"global_step_{step}" / "actor").mkdir(parents=True)
    ckpt.mkdir(exist_ok=True)
    if tracker is not None:
        (ckpt / TRACKER_FILE).write_text(str(tracker))
    return ckpt


def restore_cli(tmp_path: Path, ckpt: Path, incident: int = 1) -> int:
    config = tmp_path / "guardian.yaml"
    config.write_text(f"home: {tmp_path / 'home'}\n")
    with Store.open(f"sqlite:///{tmp_path / 'home' / 'guardian.db'}") as store:
        store.ensure_run(
            "r", name="r", metrics_path="m", rollouts_dir="", checkpoints_dir=str(ckpt), mode="enforce", now=0.0
        )
    return main(["checkpoints", "restore", "r", "--incident", str(incident), "--config", str(config)])


# -- C1: the lock file ------------------------------------------------------------------------------------------
def test_c1_a_planted_lock_symlink_is_refused_and_the_file_it_names_is_left_as_it_was(tmp_path: Path) -> None:
    victim = tmp_path / "victim" / "precious.txt"
    victim.parent.mkdir()
    victim.write_text("my thesis\n")
    ckpt = ckpt_with(tmp_path)
    (ckpt / LOCK_NAME).symlink_to(victim)
    with pytest.raises(DirLockedError, match=rf"{LOCK_NAME} is a symlink.*remove the link"), holding(ckpt, "run-a"):
        pass
    assert victim.read_text() == "my thesis\n"


def test_c1_a_dangling_lock_symlink_creates_nothing_outside_the_checkpoint_dir(tmp_path: Path) -> None:
    ckpt = ckpt_with(tmp_path)
    outside = tmp_path / "elsewhere" / "new-file"
    outside.parent.mkdir()
    (ckpt / LOCK_NAME).symlink_to(outside)
    with pytest.raises(DirLockedError, match="is a symlink"), holding(ckpt, "run-a"):
        pass
    assert not outside.exists()


def test_c1_a_lock_that_is_a_folder_or_a_fifo_is_refused_clearly(tmp_path: Path, deadline: None) -> None:
    ckpt = ckpt_with(tmp_path)
    (ckpt / LOCK_NAME).mkdir()
    with pytest.raises(DirLockedError, match=rf"{LOCK_NAME} is a folder, not a regular file"), holding(ckpt, "a"):
        pass
    (ckpt / LOCK_NAME).rmdir()
    os.mkfifo(ckpt / LOCK_NAME)
    with pytest.raises(DirLockedError, match=rf"{LOCK_NAME} is a FIFO, not a regular file"), holding(ckpt, "a"):
        pass


def test_c1_checkpoints_restore_never_writes_through_a_lock_symlink(tmp_path: Path) -> None:
    ckpt = ckpt_with(tmp_path, 5, 10, tracker=10)
    quarantine_after(ckpt, 5, incident_id=1)
    victim = tmp_path / "precious.txt"
    victim.write_text("keep\n")
    (ckpt / LOCK_NAME).symlink_to(victim)
    assert restore_cli(tmp_path, ckpt) == 1
    assert victim.read_text() == "keep\n"
    assert not (ckpt / "global_step_10").exists()  # nothing restored without the lock


def test_c1_guardian_run_with_a_planted_lock_symlink_refuses_before_anything_starts(tmp_path: Path) -> None:
    ckpt = ckpt_with(tmp_path)
    victim = tmp_path / "precious.txt"
    victim.write_text("keep\n")
    (ckpt / LOCK_NAME).symlink_to(victim)
    config = config_for(tmp_path / "home")
    assert run_guarded(config, RunRequest(tuple(collapse_command(ckpt)), tmp_path, "lock1")) == 1
    assert victim.read_text() == "keep\n"
    with Store.open(config.database_url()) as store:
        assert store.get_run("lock1") is None  # nothing registered, nothing launched


def test_the_lock_still_works_on_a_checkpoint_dir_that_is_itself_a_symlink(tmp_path: Path) -> None:
    real = ckpt_with(tmp_path)
    link = tmp_path / "ckpt-link"
    link.symlink_to(real)
    with holding(link, "run-a") as lock:
        assert "run=run-a" in lock.read_text()
    assert (real / LOCK_NAME).is_file()


# -- C2: .guardian-pinned ---------------------------------------------------------------------------------------
def planted_pin_dir(tmp_path: Path) -> tuple[Path, Path]:
    victim = tmp_path / "victim-pins"
    (victim / ".tmp-user-backup").mkdir(parents=True)
    (victim / ".tmp-user-backup" / "thesis.tex").write_text("chapter 1")
    ckpt = tmp_path / "ckpt"
    save(ckpt, 10)
    (ckpt / PIN_DIR).symlink_to(victim)
    return ckpt, victim


def test_c2_leftover_cleanup_never_follows_a_planted_pin_folder_symlink(tmp_path: Path) -> None:
    ckpt, victim = planted_pin_dir(tmp_path)
    with pytest.raises(PinError, match=rf"{PIN_DIR} is a symlink"):
        remove_leftovers(ckpt)
    assert (victim / ".tmp-user-backup" / "thesis.tex").read_text() == "chapter 1"


def test_c2_no_pin_is_built_release_or_restored_through_a_planted_pin_folder_symlink(tmp_path: Path) -> None:
    ckpt, victim = planted_pin_dir(tmp_path)
    with pytest.raises(PinError, match=rf"{PIN_DIR} is a symlink"):
        pin_checkpoint(ckpt, 10, min_free_bytes=0)
    (victim / "global_step_10" / "actor").mkdir(parents=True)
    (victim / ".tmp-release-global_step_10-1").mkdir()
    with pytest.raises(PinError, match=rf"{PIN_DIR} is a symlink"):
        release_pin(ckpt, 10)
    with pytest.raises(PinError, match=rf"{PIN_DIR} is a symlink"):
        restore_pin(ckpt, 10, min_free_bytes=0)
    assert pinned_steps(ckpt) == {}
    assert sorted(p.name for p in victim.iterdir()) == [
        ".tmp-release-global_step_10-1",
        ".tmp-user-backup",
        "global_step_10",
    ]
    assert (victim / ".tmp-user-backup" / "thesis.tex").exists()


def test_c2_the_pin_pass_says_so_in_one_line_and_touches_nothing_outside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt, victim = planted_pin_dir(tmp_path)
    store = Store.open(f"sqlite:///{tmp_path / 'guardian.db'}")
    store.ensure_run("p", name="p", metrics_path="m", rollouts_dir="r", checkpoints_dir="c", mode="enforce", now=0.0)
    store.record_checkpoint("p", step=10, path=str(ckpt / "global_step_10"), verdict="healthy", now=1.0)
    health = StepHealth()
    config = CheckpointsConfig(pin_keep=2, healthy_window_steps=5, copy_min_free_gib=0.0)
    with caplog.at_level("INFO", logger="guardian"):
        pinner = Pinner(config, store, "p", ckpt, ManualClock(100.0))
        pinner.run(health, 40, 1, on_disk=read_checkpoints(ckpt), incident_open=False)
    assert "event=pin_failed" in caplog.text and f"{PIN_DIR} is a symlink" in caplog.text
    assert "pin_leftovers_removed" not in caplog.text
    assert sorted(p.name for p in victim.iterdir()) == [".tmp-user-backup"]


def test_c2_guardian_run_refuses_at_start_a_checkpoint_dir_with_a_planted_guardian_folder(tmp_path: Path) -> None:
    ckpt, victim = planted_pin_dir(tmp_path)
    with pytest.raises(DirLockedError, match=rf"{PIN_DIR} is a symlink"), holding(ckpt, "run-a"):
        pass
    assert sorted(p.name for p in victim.iterdir()) == [".tmp-user-backup"]


# -- C3 and C7: .guardian-quarantine ----------------------------------------------------------------------------
def test_c3_a_rollback_never_moves_checkpoints_through_a_planted_quarantine_symlink(tmp_path: Path) -> None:
    ckpt = ckpt_with(tmp_path, 10, 20, 30, tracker=30)
    victim = tmp_path / "victim-q"
    victim.mkdir()
    (ckpt / QUARANTINE_DIR).symlink_to(victim)
    with pytest.raises(CheckpointError, match=rf"{QUARANTINE_DIR} is a symlink"):
        quarantine_after(ckpt, 10, incident_id=1)
    with pytest.raises(CheckpointError, match=rf"{QUARANTINE_DIR} is a symlink"):
        quarantine_all(ckpt, incident_id=1)
    assert list(victim.iterdir()) == []
    assert read_tracker(ckpt) == 30  # refused before anything changed
    assert [c.step for c in scan_checkpoints(ckpt)] == [10, 20, 30]


def test_c3_pins_set_aside_and_restores_never_go_through_a_planted_quarantine_symlink(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    save(ckpt, 10)
    pin_checkpoint(ckpt, 10, min_free_bytes=0)
    retention_deletes(ckpt / "global_step_10")
    victim = tmp_path / "victim-q"
    victim.mkdir()
    (ckpt / QUARANTINE_DIR).symlink_to(victim)
    with pytest.raises(CheckpointError, match=rf"{QUARANTINE_DIR} is a symlink"):
        set_aside_pins(ckpt, 1, after_step=None)
    with pytest.raises(PinError, match=rf"{QUARANTINE_DIR} is a symlink"):
        restore_pin(ckpt, 10, min_free_bytes=0)
    assert list(victim.iterdir()) == []
    assert 10 in pinned_steps(ckpt)


def test_c3_restore_never_reads_a_quarantine_through_a_symlink(tmp_path: Path) -> None:
    ckpt = ckpt_with(tmp_path, 10, tracker=10)
    victim = tmp_path / "victim-q"
    (victim / "incident-1" / "global_step_20" / "actor").mkdir(parents=True)
    (ckpt / QUARANTINE_DIR).symlink_to(victim)
    with pytest.raises(CheckpointError, match=rf"{QUARANTINE_DIR} is a symlink"):
        restore_quarantine(ckpt, 1)
    assert (victim / "incident-1" / "global_step_20").is_dir() and not (ckpt / "global_step_20").exists()


def test_c3_the_dump_dirs_quarantine_is_never_a_planted_symlink(tmp_path: Path) -> None:
    dumps, victim = tmp_path / "dumps", tmp_path / "victim-d"
    dumps.mkdir()
    victim.mkdir()
    for step in (5, 10):
        (dumps / f"{step}.jsonl").write_text("{}\n")
    (dumps / QUARANTINE_DIR).symlink_to(victim)
    with pytest.raises(CheckpointError, match=rf"{QUARANTINE_DIR} is a symlink"):
        quarantine_dumps_after(dumps, 5, 1)
    assert list(victim.iterdir()) == [] and (dumps / "10.jsonl").is_file()


def test_c7_a_regular_file_where_the_quarantine_folder_goes_is_a_clear_error_before_any_change(
    tmp_path: Path,
) -> None:
    ckpt = ckpt_with(tmp_path, 10, 20, tracker=20)
    (ckpt / QUARANTINE_DIR).write_text("x\n")
    with pytest.raises(CheckpointError, match=rf"{QUARANTINE_DIR} is a regular file, not a folder.*move it"):
        quarantine_after(ckpt, 10, incident_id=1)
    assert read_tracker(ckpt) == 20 and [c.step for c in scan_checkpoints(ckpt)] == [10, 20]
    refused = pytest.raises(DirLockedError, match=rf"{QUARANTINE_DIR} is a regular file, not a folder")
    with refused, holding(ckpt, "run-a"):
        pass
    assert (ckpt / QUARANTINE_DIR).read_text() == "x\n"  # evidence: never removed


def test_c7_a_regular_file_where_the_pin_folder_goes_is_refused_at_start(tmp_path: Path) -> None:
    ckpt = ckpt_with(tmp_path, 10)
    (ckpt / PIN_DIR).write_text("x\n")
    with pytest.raises(DirLockedError, match=rf"{PIN_DIR} is a regular file, not a folder"), holding(ckpt, "a"):
        pass


# -- C4 and C5: step folders under verl's names only ------------------------------------------------------------
ODD_NAMES = (
    "global_step_0300",
    "global_step_\u0663\u0660\u0660",
    "global_step_300\n",
    "global_step_+300",
    "global_step_",
)


def test_c4_only_canonical_step_folder_names_are_checkpoints_the_others_are_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = ckpt_with(tmp_path, 0, 10)
    for name in ODD_NAMES:
        (ckpt / name / "actor").mkdir(parents=True)
    with caplog.at_level("WARNING", logger="guardian"):
        assert [c.step for c in scan_checkpoints(ckpt)] == [0, 10]
        scan_checkpoints(ckpt)
    warned = [r.getMessage() for r in caplog.records if "event=checkpoint_name_ignored" in r.getMessage()]
    assert len(warned) == len(ODD_NAMES)  # once per folder, not once per scan
    assert any("global_step_0300" in line for line in warned)
    assert all("\n" not in line for line in warned)


def test_c4_a_rollback_beside_a_non_canonical_folder_moves_the_real_ones_and_leaves_it(tmp_path: Path) -> None:
    ckpt = ckpt_with(tmp_path, 10, 20, 30, tracker=30)
    for name in ODD_NAMES[:2]:
        (ckpt / name / "actor").mkdir(parents=True)
    result = quarantine_after(ckpt, 10, incident_id=1)
    assert [m.step for m in result.moved] == [20, 30]
    assert read_tracker(ckpt) == 10
    assert all((ckpt / name).is_dir() for name in ODD_NAMES[:2])  # not the guardian's: left alone


@pytest.mark.parametrize("name", ODD_NAMES)
def test_c4_a_non_canonical_folder_is_no_resume_path(tmp_path: Path, name: str) -> None:
    with pytest.raises(CheckpointError, match="not a verl checkpoint folder"):
        resume_path_for(tmp_path / name)


def test_c5_restore_never_points_the_tracker_at_a_folder_that_does_not_exist(tmp_path: Path) -> None:
    ckpt = ckpt_with(tmp_path, 10, 20, 30, tracker=30)
    quarantine_after(ckpt, 10, incident_id=1)
    (ckpt / "global_step_0900" / "actor").mkdir(parents=True)
    (ckpt / "global_step_\u0667\u0660\u0660" / "actor").mkdir(parents=True)
    result = restore_quarantine(ckpt, 1)
    assert result.tracker_after == 30 and read_tracker(ckpt) == 30
    assert (ckpt / f"global_step_{read_tracker(ckpt)}").is_dir()


def test_c5_the_cli_restore_sets_the_tracker_to_an_existing_folder(tmp_path: Path) -> None:
    ckpt = ckpt_with(tmp_path, 10, 20, tracker=20)
    quarantine_after(ckpt, 10, incident_id=1)
    (ckpt / "global_step_0900" / "actor").mkdir(parents=True)
    assert restore_cli(tmp_path, ckpt) == 0
    assert (ckpt / TRACKER_FILE).read_text() == "20"


def test_c5_the_tracker_is_never_written_for_a_step_without_its_folder(tmp_path: Path) -> None:
    ckpt = ckpt_with(tmp_path, 10, tracker=10)
    (ckpt / "global_step_0900" / "actor").mkdir(parents=True)
    with pytest.raises(CheckpointError, match=r"global_step_900 does not exist"):
        write_tracker(ckpt, 900)
    assert read_tracker(ckpt) == 10


# -- C6: a step folder that is a symlink ------------------------------------------------------------------------
def test_c6_a_symlinked_step_folder_is_used_by_its_own_path_as_verl_would(tmp_path: Path) -> None:
    store = tmp_path / "store" / "abc"
    (store / "actor").mkdir(parents=True)
    ckpt = ckpt_with(tmp_path, 10, tracker=15)
    (ckpt / "global_step_15").symlink_to(store)
    found = {c.step: c.path for c in scan_checkpoints(ckpt)}
    assert found[15] == ckpt.absolute() / "global_step_15"
    assert resume_path_for(found[15]).endswith("/global_step_15")
    # a rollback past it moves the link, never what it points to
    result = quarantine_after(ckpt, 10, incident_id=1)
    assert [m.step for m in result.moved] == [15]
    assert (store / "actor").is_dir()
    assert (ckpt / QUARANTINE_DIR / "incident-1" / "global_step_15").is_symlink()


# -- C9: a FIFO tracker -----------------------------------------------------------------------------------------
def test_c9_a_fifo_tracker_is_refused_at_once_naming_it(tmp_path: Path, deadline: None) -> None:
    ckpt = ckpt_with(tmp_path, 10)
    os.mkfifo(ckpt / TRACKER_FILE)
    with pytest.raises(CheckpointError, match=rf"{TRACKER_FILE} is a FIFO, not a regular file"):
        read_tracker(ckpt)


def test_c9_checkpoints_restore_with_a_fifo_tracker_refuses_and_lets_the_lock_go(
    tmp_path: Path, deadline: None, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = ckpt_with(tmp_path, 10, 20, tracker=20)
    quarantine_after(ckpt, 10, incident_id=1)
    (ckpt / TRACKER_FILE).unlink()
    os.mkfifo(ckpt / TRACKER_FILE)
    assert restore_cli(tmp_path, ckpt) == 1
    said = capsys.readouterr().err
    assert "event=restore_refused" in said and f"{TRACKER_FILE} is a FIFO" in said and "Traceback" not in said
    assert not (ckpt / "global_step_20").exists()  # refused before anything moved
    assert stat.S_ISFIFO((ckpt / TRACKER_FILE).lstat().st_mode)  # left for a person to look at
    with holding(ckpt, "next"):  # the lock was released
        pass


# -- C10: the tracker's mode ------------------------------------------------------------------------------------
def test_c10_the_rewritten_tracker_keeps_verls_mode(tmp_path: Path) -> None:
    ckpt = ckpt_with(tmp_path, 10, 20, 30, tracker=30)
    (ckpt / TRACKER_FILE).chmod(0o644)
    quarantine_after(ckpt, 20, incident_id=1)
    assert stat.S_IMODE((ckpt / TRACKER_FILE).stat().st_mode) == 0o644
    (ckpt / TRACKER_FILE).chmod(0o640)  # a site's own choice is kept
    quarantine_after(ckpt, 10, incident_id=2)
    assert stat.S_IMODE((ckpt / TRACKER_FILE).stat().st_mode) == 0o640


def test_c10_a_tracker_the_guardian_creates_is_0644(tmp_path: Path) -> None:
    ckpt = ckpt_with(tmp_path, 10)
    write_tracker(ckpt, 10)
    assert stat.S_IMODE((ckpt / TRACKER_FILE).stat().st_mode) == 0o644
