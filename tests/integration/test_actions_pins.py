"""Pins on a real filesystem: hard links that outlive verl's retention, the copy where links are refused (EXDEV
simulated), the free-space refusal, release, restore into place, and the bad cases - a checkpoint that vanishes
mid-link, a folder that cannot be written, a full disk - each one clear error that leaves nothing behind and
deletes nothing of the user's."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from verl_saves import WEIGHTS, retention_deletes, save

from guardian.checkpoints import pinning as pins
from guardian.checkpoints.pinning import (
    PIN_DIR,
    CopyRefused,
    PinError,
    held_bytes,
    pin_checkpoint,
    pinned_path,
    pinned_steps,
    release_pin,
    restore_pin,
    set_aside_pins,
)
from guardian.checkpoints.quarantine import QUARANTINE_DIR
from guardian.checkpoints.scan import CheckpointError, resumable
from guardian.states import PinMode

FREE = 1 << 40  # plenty: no pin here is refused for space unless a test says so


def size_of(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def refuse_links(monkeypatch: pytest.MonkeyPatch, code: int = errno.EXDEV) -> None:
    def link(src: object, dst: object, **kwargs: object) -> None:
        raise OSError(code, os.strerror(code), str(src))

    monkeypatch.setattr(pins.os, "link", link)


def free_space(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    monkeypatch.setattr(pins.shutil, "disk_usage", lambda path: SimpleNamespace(total=2 * free, used=free, free=free))


def nothing_left_behind(root: Path) -> None:
    assert not [p.name for p in (root / PIN_DIR).glob(".tmp-*")], "a temporary folder outlived the call"


def test_a_pin_hard_links_every_file_and_recreates_the_folders(tmp_path: Path) -> None:
    source = save(tmp_path, 30)
    result = pin_checkpoint(tmp_path, 30, min_free_bytes=0)
    pinned = tmp_path / PIN_DIR / "global_step_30"
    assert (result.mode, result.bytes_added, result.files, result.pinned) == (PinMode.LINK, 0, 4, pinned)
    for original in source.rglob("*"):
        copy = pinned / original.relative_to(source)
        if original.is_symlink():
            assert copy.is_symlink() and os.readlink(copy) == os.readlink(original)
        elif original.is_dir():
            assert copy.is_dir() and not copy.is_symlink()
        else:
            assert os.path.samefile(original, copy), f"{copy} is not a hard link of {original}"
    assert (pinned / "actor" / "empty").is_dir()
    assert pinned_steps(tmp_path) == {30: pinned}
    assert held_bytes(pinned) == 0, "while the original exists a hard-linked pin holds nothing of its own"
    nothing_left_behind(tmp_path)


def test_a_pin_outlives_verls_retention_and_then_holds_the_checkpoints_bytes(tmp_path: Path) -> None:
    source = save(tmp_path, 30)
    size = size_of(source)
    pin_checkpoint(tmp_path, 30, min_free_bytes=0)
    retention_deletes(source)
    assert not resumable(source) and (source / "data.pt").is_file()
    pinned = pinned_path(tmp_path, 30)
    assert (pinned / "actor" / "model_world_size_1_rank_0.pt").read_bytes() == WEIGHTS + b"30"
    assert held_bytes(pinned) == size - 100, "everything but data.pt (still linked from the original) is the pin's"


def test_a_pin_already_in_place_is_adopted_not_made_twice(tmp_path: Path) -> None:
    save(tmp_path, 30)
    first = pin_checkpoint(tmp_path, 30, min_free_bytes=0)
    again = pin_checkpoint(tmp_path, 30, min_free_bytes=0)
    assert again.adopted and (again.mode, again.bytes_added, again.pinned) == (PinMode.LINK, 0, first.pinned)


def test_a_pin_in_place_that_holds_other_files_is_refused_not_overwritten(tmp_path: Path) -> None:
    save(tmp_path, 30)
    stranger = tmp_path / PIN_DIR / "global_step_30"
    stranger.mkdir(parents=True)
    (stranger / "notes.txt").write_text("mine")
    with pytest.raises(PinError, match="never overwrites a pin"):
        pin_checkpoint(tmp_path, 30, min_free_bytes=0)
    assert (stranger / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("code", [errno.EXDEV, errno.EPERM])
def test_refused_hard_links_fall_back_to_a_copy_that_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    source = save(tmp_path, 30)
    refuse_links(monkeypatch, code)
    free_space(monkeypatch, FREE)
    result = pin_checkpoint(tmp_path, 30, min_free_bytes=1 << 30)
    assert result.mode is PinMode.COPY and result.bytes_added == size_of(source)
    assert errno.errorcode[code] in result.copied_because
    copy = result.pinned / "actor" / "model_world_size_1_rank_0.pt"
    assert copy.read_bytes() == WEIGHTS + b"30" and not os.path.samefile(copy, source / copy.relative_to(result.pinned))
    assert (result.pinned / "actor" / "latest.pt").is_symlink()
    retention_deletes(source)
    assert held_bytes(result.pinned) == size_of(result.pinned)
    nothing_left_behind(tmp_path)


def test_a_copy_below_the_free_space_threshold_is_refused_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save(tmp_path, 30)
    refuse_links(monkeypatch)
    free_space(monkeypatch, 10 << 30)  # 10 GiB free, 20 GiB must stay free
    with pytest.raises(CopyRefused) as refused:
        pin_checkpoint(tmp_path, 30, min_free_bytes=20 << 30)
    message = str(refused.value)
    assert "\n" not in message and str(tmp_path / "global_step_30") in message
    assert "EXDEV" in message and "checkpoints.copy_min_free_gib (20.00)" in message and "10.00 GiB free" in message
    assert pinned_steps(tmp_path) == {}
    nothing_left_behind(tmp_path)


def test_a_checkpoint_that_vanishes_mid_link_is_not_pinned_and_nothing_else_is_touched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = save(tmp_path, 30)
    real_link, calls = os.link, []

    def link_while_verl_deletes(src: str, dst: str, **kwargs: bool) -> None:
        calls.append(src)
        if len(calls) == 2:
            retention_deletes(source)  # verl's retention runs while the guardian links
        real_link(src, dst, **kwargs)

    monkeypatch.setattr(pins.os, "link", link_while_verl_deletes)
    with pytest.raises(PinError, match=r"changed while it was pinned: .* vanished") as failed:
        pin_checkpoint(tmp_path, 30, min_free_bytes=0)
    assert str(source) in str(failed.value) and "\n" not in str(failed.value)
    assert pinned_steps(tmp_path) == {} and (source / "data.pt").read_bytes() == b"d" * 100
    nothing_left_behind(tmp_path)


def test_a_checkpoint_that_loses_files_before_they_were_listed_is_not_pinned_either(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verl's retention half-way through the folder when the guardian lists it: every link it tries works, the
    listing was short; the check after building compares the folder with what was linked."""
    source = save(tmp_path, 30)
    (source / "actor" / "optim_world_size_1_rank_0.pt").unlink()  # already deleted when the guardian lists it
    real_link, calls = os.link, []

    def link_then_verl_deletes(src: str, dst: str, **kwargs: bool) -> None:
        real_link(src, dst, **kwargs)
        calls.append(src)
        if len(calls) == 3:  # the last file linked: verl's rmtree carries on
            retention_deletes(source)

    monkeypatch.setattr(pins.os, "link", link_then_verl_deletes)
    with pytest.raises(PinError, match="changed while it was pinned"):
        pin_checkpoint(tmp_path, 30, min_free_bytes=0)
    assert pinned_steps(tmp_path) == {}
    nothing_left_behind(tmp_path)


def test_a_checkpoint_dir_that_cannot_be_written_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save(tmp_path, 30)
    real_mkdir = os.mkdir

    def read_only(path: str | os.PathLike[str], *args: int, **kwargs: object) -> None:
        if Path(path).name == PIN_DIR:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        real_mkdir(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "mkdir", read_only)
    with pytest.raises(PinError) as failed:
        pin_checkpoint(tmp_path, 30, min_free_bytes=0)
    message = str(failed.value)
    assert message.startswith(f"cannot create {tmp_path / PIN_DIR}: Read-only file system (EROFS)")
    assert "checkpoints.pin_keep: 0" in message and (tmp_path / "global_step_30" / "actor").is_dir()


def test_a_full_disk_during_a_copy_keeps_nothing_half_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save(tmp_path, 30)
    refuse_links(monkeypatch)
    free_space(monkeypatch, FREE)
    real_copy, copied = shutil.copyfile, []

    def fill_up(src: str, dst: str, **kwargs: bool) -> object:
        copied.append(src)
        if len(copied) == 3:
            raise OSError(errno.ENOSPC, "No space left on device", dst)
        return real_copy(src, dst, **kwargs)

    monkeypatch.setattr(pins.shutil, "copyfile", fill_up)
    with pytest.raises(PinError, match=rf"disk full under {tmp_path / PIN_DIR} while pinning"):
        pin_checkpoint(tmp_path, 30, min_free_bytes=0)
    assert pinned_steps(tmp_path) == {}
    nothing_left_behind(tmp_path)


def test_a_missing_checkpoint_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    with pytest.raises(PinError, match=r"checkpoint .*global_step_7 is not there"):
        pin_checkpoint(tmp_path, 7, min_free_bytes=0)


def test_an_interrupted_pin_leaves_a_temporary_folder_the_next_one_removes(tmp_path: Path) -> None:
    save(tmp_path, 30)
    stale = tmp_path / PIN_DIR / ".tmp-pin-global_step_30-99999"
    (stale / "actor").mkdir(parents=True)
    pin_checkpoint(tmp_path, 30, min_free_bytes=0)
    assert not stale.exists() and pinned_steps(tmp_path) == {30: pinned_path(tmp_path, 30)}


def test_release_removes_only_the_guardians_pin(tmp_path: Path) -> None:
    source = save(tmp_path, 30)
    pin_checkpoint(tmp_path, 30, min_free_bytes=0)
    assert release_pin(tmp_path, 30) is True
    assert not pinned_path(tmp_path, 30).exists() and source.is_dir() and resumable(source)
    assert (source / "actor" / "model_world_size_1_rank_0.pt").read_bytes() == WEIGHTS + b"30"
    assert release_pin(tmp_path, 30) is False, "a pin already gone is fine"
    nothing_left_behind(tmp_path)


def test_release_never_follows_a_symlink_in_place_of_a_pin(tmp_path: Path) -> None:
    users = save(tmp_path, 30)
    (tmp_path / PIN_DIR).mkdir()
    pinned_path(tmp_path, 30).symlink_to(users)
    with pytest.raises(PinError, match="is a symlink, not a pin the guardian made"):
        release_pin(tmp_path, 30)
    assert resumable(users)


def test_restore_puts_a_pinned_checkpoint_back_after_verls_retention_emptied_it(tmp_path: Path) -> None:
    source = save(tmp_path, 30)
    pin_checkpoint(tmp_path, 30, min_free_bytes=0)
    retention_deletes(source)
    result = restore_pin(tmp_path, 30, min_free_bytes=0)
    assert result.mode is PinMode.LINK and result.target == source and resumable(source)
    model = source / "actor" / "model_world_size_1_rank_0.pt"
    assert os.path.samefile(model, pinned_path(tmp_path, 30) / model.relative_to(source))
    assert result.set_aside == tmp_path / QUARANTINE_DIR / "before-restore" / "global_step_30"
    assert (result.set_aside / "data.pt").read_bytes() == b"d" * 100, "what stood there is kept, not deleted"
    assert pinned_steps(tmp_path) == {30: pinned_path(tmp_path, 30)}, "the pin stays"
    again = restore_pin(tmp_path, 30, min_free_bytes=0)
    assert (again.mode, again.set_aside) == (None, None), "an intact original is left alone"
    nothing_left_behind(tmp_path)


def test_restore_of_a_folder_that_is_gone_altogether(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = save(tmp_path, 30)
    pin_checkpoint(tmp_path, 30, min_free_bytes=0)
    shutil.rmtree(source)
    refuse_links(monkeypatch)
    free_space(monkeypatch, FREE)
    result = restore_pin(tmp_path, 30, min_free_bytes=0)
    assert (result.mode, result.set_aside) == (PinMode.COPY, None) and "EXDEV" in result.copied_because
    assert (source / "actor" / "model_world_size_1_rank_0.pt").read_bytes() == WEIGHTS + b"30"


def test_restore_without_a_pin_says_so_as_a_checkpoint_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"no pinned copy of step 30: .* does not exist"):
        restore_pin(tmp_path, 30, min_free_bytes=0)


def test_pins_of_an_abandoned_branch_are_set_aside_into_the_incidents_quarantine(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        save(tmp_path, step)
        pin_checkpoint(tmp_path, step, min_free_bytes=0)
    assert set_aside_pins(tmp_path, 4, after_step=10) == [20, 30]
    assert list(pinned_steps(tmp_path)) == [10]
    folder = tmp_path / QUARANTINE_DIR / "incident-4" / "pinned"
    assert sorted(p.name for p in folder.iterdir()) == ["global_step_20", "global_step_30"]
    assert set_aside_pins(tmp_path, 4, after_step=10) == [], "idempotent"
    assert set_aside_pins(tmp_path, 5, after_step=None) == [10]


@pytest.mark.parametrize("fail", ["link", "copy"])
def test_every_failure_is_a_checkpoint_error_so_a_rollback_can_say_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: str
) -> None:
    save(tmp_path, 30)

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EIO, "Input/output error", "x")

    target: Callable[..., object] = broken
    if fail == "copy":
        refuse_links(monkeypatch)
        free_space(monkeypatch, FREE)
        monkeypatch.setattr(pins.shutil, "copyfile", target)
    else:
        monkeypatch.setattr(pins.os, "link", target)
    with pytest.raises(CheckpointError, match=r"cannot pin .*global_step_30 into .*: Input/output error \(EIO\)"):
        pin_checkpoint(tmp_path, 30, min_free_bytes=0)
    nothing_left_behind(tmp_path)
